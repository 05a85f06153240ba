-- remove_repeatable: delete a spec (wire spec 11.9), active or paused.
-- KEYS[1] = repeat   KEYS[2] = repeat:spec:<key>   KEYS[3] = repeat:paused
-- ARGV    = [spec_key]
-- Reply   = 1 when a spec was removed, 0 when there was none
-- A `repeat:paused` of another type holds no paused spec: it is skipped, so a spoiled paused
-- set cannot make every removal fail after the spec left `repeat`.
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
local pt = redis.call('TYPE', KEYS[3]).ok
if pt == 'zset' then
  removed = removed + redis.call('ZREM', KEYS[3], ARGV[1])
end
removed = removed + redis.call('DEL', KEYS[2])
if removed > 0 then
  return 1
end
return 0
