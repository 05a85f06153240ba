-- acquire_lock: take or renew a leader lock (wire spec 11.5).
-- KEYS[1] = {chasqui:<q>}:promoter:lock or :scheduler:lock
-- ARGV    = [holder_id, ttl_secs]
-- Reply   = 1 leader, 0 someone else leads
-- A key of another type (hostile) holds no holder: it is replaced.  A holder that set no expiry
-- (foreign: every holder sets one) is given the lock's TTL, so it lapses unless renewed; before,
-- either one kept every promoter or scheduler out for ever.
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'string' and kind ~= 'none' then
  redis.call('DEL', KEYS[1])
end
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 1
end
if cur == ARGV[1] then
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('PTTL', KEYS[1]) == -1 then
  redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return 0
