-- add_prioritized: jobs with a priority wait in the queue's prioritized set (issue 24), lowest
-- score first: score = priority * 2^37 + a per-queue sequence number, so a lower priority number
-- runs first and jobs of one priority run in the order they were added.  The sequence lives in
-- the controls hash (`prio_seq`); its presence tells the workers to look at the set.  A controls
-- key or a set of another type (hostile, foreign) is replaced.
-- KEYS[1] = controls hash, KEYS[2] = prioritized set
-- ARGV    = [n, then per job: priority, member (u32le name length + name + envelope)]
-- Reply   = the sequence number of the last job
for j, want in ipairs({'hash', 'zset'}) do
  local kind = redis.call('TYPE', KEYS[j]).ok
  if kind ~= want and kind ~= 'none' then
    redis.call('DEL', KEYS[j])
  end
end
--#include prio_seq
local n = tonumber(ARGV[1])
local last = take_seq(KEYS[1], KEYS[2], n)
local first = last - n + 1
local args = {}
for i = 1, n do
  args[#args + 1] = tonumber(ARGV[2 * i]) * 137438953472 + first + i - 1
  args[#args + 1] = ARGV[2 * i + 1]
  if #args >= 1000 then
    redis.call('ZADD', KEYS[2], unpack(args))
    args = {}
  end
end
if #args > 0 then
  redis.call('ZADD', KEYS[2], unpack(args))
end
return last
