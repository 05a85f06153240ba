-- prio_seq: the sequence of the prioritized set (issue 24), for the scripts that add to it
-- (add_prioritized, enqueue_batch_side_once, schedule_batch; `--#include prio_seq`).
--
-- take_seq(controls, prioritized, n): raise the controls hash's `prio_seq` by n; the new value.
-- A counter HINCRBY rejects (not an integer, or at its limit: hostile or foreign), or one that
-- lands outside 1 .. 2^37 (the room a score leaves it), is rebuilt from the set's highest
-- sequence, never an error: a script must not fail after its first write (the writes before
-- stay, the fence after never comes), and jobs of one priority keep the order they were added
-- in.  Callers have replaced a controls key or a set of another type already.
local function take_seq(controls, prioritized, n)
  local last = redis.pcall('HINCRBY', controls, 'prio_seq', n)
  if type(last) == 'number' and last >= n and last < 137438953472 then
    return last
  end
  local top = 0
  local scores = redis.call('ZRANGE', prioritized, 0, -1, 'WITHSCORES')
  for j = 2, #scores, 2 do
    local seq = math.fmod(tonumber(scores[j]) or 0, 137438953472)
    if seq > top then
      top = seq
    end
  end
  redis.call('HSET', controls, 'prio_seq', string.format('%d', top + n))
  return top + n
end
