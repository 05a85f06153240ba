-- key_types: the keys a script writes, checked before its first write (`--#include key_types`).
-- A script's writes are not rolled back when a later command fails: a marker set first would
-- make the retry write nothing, a job taken from one key and not written to the other would be
-- lost, one written and not taken would be moved again.
--
-- wrong_type(script, {key, type, ...}): an error reply naming the first key that exists with
-- another type than the one given, or nil.
local function wrong_type(script, want)
  for j = 1, #want, 2 do
    local t = redis.call('TYPE', want[j]).ok
    if t ~= want[j + 1] and t ~= 'none' then
      return redis.error_reply(script .. ': ' .. want[j] .. ' is a ' .. t .. ', not a ' .. want[j + 1])
    end
  end
  return nil
end

-- events_max_for(key, max): `max`, or 0 when the events key is of another type: events are
-- best effort, so a spoiled events stream turns them off rather than failing the script after
-- its first write.
local function events_max_for(key, max)
  if max > 0 then
    local t = redis.call('TYPE', key).ok
    if t ~= 'stream' and t ~= 'none' then
      return 0
    end
  end
  return max
end
