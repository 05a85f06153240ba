-- cancel_delayed: remove a delayed job scheduled with an id (wire spec 11.7).
-- KEYS[1] = delayed   KEYS[2] = {chasqui:<q>}:didx:<id>   KEYS[3] = {chasqui:<q>}:dlid:<id>
-- Reply   = 1 removed, 0 not found / already promoted
local m = redis.call('GET', KEYS[2])
if not m then
  return 0
end
if redis.call('ZREM', KEYS[1], m) == 0 then
  return 0
end
redis.call('DEL', KEYS[2], KEYS[3])
return 1
