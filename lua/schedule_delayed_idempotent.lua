-- schedule_delayed_idempotent: ChasquiMQ's delayed add with a caller id (wire spec 11.6).
-- KEYS[1] = {chasqui:<q>}:dlid:<id>   KEYS[2] = delayed   KEYS[3] = {chasqui:<q>}:didx:<id>
-- ARGV    = [ttl_secs, run_at_ms, member]
-- Reply   = 1 scheduled, 0 duplicate suppressed; an error, nothing written, when the delayed set
--           is of another type (a marker set first would suppress the retry)
--#include key_types
local refused = wrong_type('schedule_delayed_idempotent', {KEYS[2], 'zset'})
if refused then
  return refused
end
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('SET', KEYS[3], ARGV[3], 'EX', ARGV[1])
return 1
