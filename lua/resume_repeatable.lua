-- resume_repeatable: move a paused spec back into `repeat` at its next future fire (computed
-- by the caller from the stored spec), if it is still paused with the score the caller read.
-- KEYS[1] = repeat   KEYS[2] = repeat:paused   KEYS[3] = repeat:spec:<key>
-- ARGV    = [spec_key, paused_score_read, next_fire_ms]
-- Reply   = 1 resumed, 0 the spec changed meanwhile (not paused any more, or re-paused)
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) or redis.call('EXISTS', KEYS[3]) == 0 then
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 1
