-- enqueue_batch_side_once: enqueue_batch_once for a chunk whose rows may wait beside the stream
-- (issue 24: the Spark data source's priority_col / group_col).  A row with a priority joins
-- the prioritized set (score and sequence as add_prioritized.lua), one with a group its group's
-- list and the round robin (as add_grouped.lua), the others the stream.  Side keys of another
-- type (hostile, foreign) are replaced, as the add scripts do.
-- KEYS[1] = stream   KEYS[2] = controls hash   KEYS[3] = prioritized   KEYS[4] = groups
-- KEYS[5] = chunk marker {chasqui:<q>}:unique:<chunk id>
-- ARGV    = [marker_ttl_ms, max_stream_len, key prefix ({chasqui:<queue>}),
--            then 4 per job: priority, group, envelope, name]
--           priority "0" = none, group "" = none (never both); name "" = no `n` field
-- Reply   = number of jobs added, or -1 when the marker was there (nothing written); an error,
--           nothing written, when the stream is of another type (the side keys are replaced)
--#include key_types
local refused = wrong_type('enqueue_batch_side_once', {KEYS[1], 'stream+'})
if refused then
  return refused
end
if not redis.call('SET', KEYS[5], '1', 'NX', 'PX', ARGV[1]) then
  return -1
end
for j, want in pairs({[2] = 'hash', [3] = 'zset', [4] = 'zset'}) do
  local kind = redis.call('TYPE', KEYS[j]).ok
  if kind ~= want and kind ~= 'none' then
    redis.call('DEL', KEYS[j])
  end
end
local maxlen, prefix = ARGV[2], ARGV[3]
local urgent = 0
for i = 4, #ARGV, 4 do
  if ARGV[i] ~= '0' then
    urgent = urgent + 1
  end
end
--#include prio_seq
local seq = 0
if urgent > 0 then
  seq = take_seq(KEYS[2], KEYS[3], urgent) - urgent
end
local turn = nil
local function member(name, env)
  local len = #name
  return string.char(len % 256, math.floor(len / 256) % 256, math.floor(len / 65536) % 256,
    math.floor(len / 16777216) % 256) .. name .. env
end
local n = 0
for i = 4, #ARGV, 4 do
  local priority, group, env, name = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if priority ~= '0' then
    seq = seq + 1
    redis.call('ZADD', KEYS[3], tonumber(priority) * 137438953472 + seq, member(name, env))
  elseif group ~= '' then
    if turn == nil then
      redis.call('HSET', KEYS[2], 'grouped', '1')
      local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
      turn = (tonumber(last[2]) or 0) + 1
    end
    local list = prefix .. ':group:' .. group
    local kind = redis.call('TYPE', list).ok
    if kind ~= 'list' and kind ~= 'none' then
      redis.call('DEL', list)
    end
    redis.call('RPUSH', list, member(name, env))
    if redis.call('ZADD', KEYS[4], 'NX', turn, group) == 1 then
      turn = turn + 1
    end
  elseif name == '' then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'd', env)
  else
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'd', env, 'n', name)
  end
  n = n + 1
end
return n
