-- upsert_repeatable: write one or many repeatable specs (wire spec 11.8, batched), plus the
-- optional `ext` field of this project (per-spec retry override and execution deadline).
-- KEYS[1] = repeat   KEYS[2] = repeat:paused   KEYS[2 + i] = repeat:spec:<key_i>
-- ARGV    = per spec i, 4 values: next_fire_ms, spec_key, stored_spec_bytes, ext ("" = none)
-- Reply   = number of specs written
-- Per spec: HSET spec; HSET ext (or HDEL it when the hash already existed); ZADD repeat next
-- key (one ZADD for up to 1,000 specs); a paused spec of that key is resumed by the upsert
-- (ZREM repeat:paused).  The `fired` counter is kept across re-upserts, as ChasquiMQ does.
local scored, keys = {}, {}
local n = 0
for i = 1, #ARGV, 4 do
  n = n + 1
  local hash = KEYS[2 + n]
  local created = redis.call('HSET', hash, 'spec', ARGV[i + 2])
  if ARGV[i + 3] ~= '' then
    redis.call('HSET', hash, 'ext', ARGV[i + 3])
  elseif created == 0 then
    redis.call('HDEL', hash, 'ext')
  end
  scored[#scored + 1] = ARGV[i]
  scored[#scored + 1] = ARGV[i + 1]
  keys[n] = ARGV[i + 1]
  if n % 1000 == 0 then
    redis.call('ZADD', KEYS[1], unpack(scored))
    scored = {}
  end
end
if #scored > 0 then
  redis.call('ZADD', KEYS[1], unpack(scored))
end
if n > 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  for i = 1, n, 1000 do
    redis.call('ZREM', KEYS[2], unpack(keys, i, math.min(n, i + 999)))
  end
end
return n
