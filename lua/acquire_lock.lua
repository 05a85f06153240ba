-- acquire_lock: take or renew a leader lock (wire spec 11.5).
-- KEYS[1] = {chasqui:<q>}:promoter:lock or :scheduler:lock
-- ARGV    = [holder_id, ttl_secs]
-- Reply   = 1 leader, 0 someone else leads
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 1
end
if cur == ARGV[1] then
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
