-- take_prioritized: move the `n` most urgent prioritized jobs (lowest score) to the stream's
-- tail, in that order, where workers read them like any other entry (issue 24).  A worker calls
-- it only when the stream has nothing left for its group, so a job without a priority runs
-- before every prioritized job (as in BullMQ).  A member that does not split into name and
-- envelope goes to the stream whole: the workers' arrival gate dead-letters it with the reason.
-- KEYS[1] = prioritized set, KEYS[2] = stream
-- ARGV    = [n, max_stream_len]
-- Reply   = the number of jobs moved
-- A set or a stream of another type, or a full stream (include/key_types.lua), moves nothing
-- (a popped member must reach the stream).
--#include key_types
if redis.call('TYPE', KEYS[1]).ok ~= 'zset' then
  return 0
end
local st = redis.call('TYPE', KEYS[2]).ok
if (st ~= 'stream' and st ~= 'none') or (st == 'stream' and stream_full(KEYS[2])) then
  return 0
end
local popped = redis.call('ZPOPMIN', KEYS[1], tonumber(ARGV[1]))
local moved = 0
for i = 1, #popped, 2 do
  local member = popped[i]
  local b1, b2, b3, b4 = string.byte(member, 1, 4)
  local len = b4 and (b1 + b2 * 256 + b3 * 65536 + b4 * 16777216)
  if not len or 4 + len > #member then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'd', member)
  elseif len == 0 then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'd', string.sub(member, 5))
  else
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'd', string.sub(member, 5 + len),
      'n', string.sub(member, 5, 4 + len))
  end
  moved = moved + 1
end
return moved
