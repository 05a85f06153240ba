-- pause_repeatable: move a spec from `repeat` to `repeat:paused`, keeping its next fire as
-- the score.  A paused spec is absent from `repeat`, so no scheduler (ChasquiMQ's included)
-- can fire it.
-- KEYS[1] = repeat   KEYS[2] = repeat:paused   KEYS[3] = repeat:spec:<key>
-- ARGV    = [spec_key]
-- Reply   = 1 paused now, 2 already paused, 0 no such spec
-- Both sets are checked before the move: a spec taken out of `repeat` and not written to a
-- `repeat:paused` of another type would stop firing with no way to resume it.
--#include key_types
local refused = wrong_type('pause_repeatable', {KEYS[1], 'zset', KEYS[2], 'zset'})
if refused then
  return refused
end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('ZADD', KEYS[2], score, ARGV[1])
  return 1
end
if redis.call('ZSCORE', KEYS[2], ARGV[1]) and redis.call('EXISTS', KEYS[3]) == 1 then
  return 2
end
return 0
