-- add_unique: add a job unless a marker for the same unique key is alive (Redis 7 stand-in
-- for XADD IDMP, and the gate behind Queue.add_unique).
-- KEYS[1] = unique marker  {chasqui:<q>}:unique:<key>
-- KEYS[2] = stream         KEYS[3] = delayed
-- ARGV    = [window_ms, job_id, run_at_ms (0 = now), max_stream_len, envelope, name, member, [traceparent]]
-- (traceparent, when given and immediate: the extra field `tp`, which ChasquiMQ readers ignore)
-- Reply   = {1, job_id} when added, {0, first_job_id} when suppressed; an error, nothing written
--           (no marker left to suppress a retry), when the key this add writes (the stream, or
--           the delayed set for a delayed add) is of another type
--#include key_types
local refused = wrong_type('add_unique', ARGV[3] == '0' and {KEYS[2], 'stream+'} or {KEYS[3], 'zset'})
if refused then
  return refused
end
local ok = redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', ARGV[1])
if not ok then
  return {0, redis.call('GET', KEYS[1])}
end
if ARGV[3] == '0' then
  if ARGV[8] ~= nil and ARGV[8] ~= '' then
    if ARGV[6] == '' then
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'd', ARGV[5], 'tp', ARGV[8])
    else
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'd', ARGV[5], 'n', ARGV[6], 'tp', ARGV[8])
    end
  elseif ARGV[6] == '' then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'd', ARGV[5])
  else
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'd', ARGV[5], 'n', ARGV[6])
  end
else
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[7])
end
return {1, ARGV[2]}
