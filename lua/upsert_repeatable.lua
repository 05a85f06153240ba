-- upsert_repeatable: write one or many repeatable specs (wire spec 11.8, batched), plus the
-- optional `ext` field of this project (per-spec retry override and execution deadline).
-- KEYS[1] = repeat   KEYS[2] = repeat:paused
-- ARGV[1] = spec hash prefix (<prefix>:repeat:spec:, same hash slot as KEYS[1])
-- ARGV[2] = width, then per spec:
--   3 per spec '3': next_fire_ms, spec_key, stored_spec
--   4 per spec '4': next_fire_ms, spec_key, stored_spec, ext   (ext "" = none)
-- Reply   = number of specs written
-- Per spec: one HSET (spec, and ext when given); a spec without ext whose hash already
-- existed loses a stale ext (HDEL); ZADD repeat next key (one ZADD per 1,000 specs); a paused
-- spec of that key is resumed by the upsert (ZREM repeat:paused).  The `fired` counter is kept
-- across re-upserts, as ChasquiMQ does.  A key of another type where a spec hash goes (hostile
-- or foreign data in the queue's keyspace) is replaced rather than failing the whole batch.  The hash keys are built here rather than passed as
-- KEYS: one argument less per spec (fetch_due does the same; same slot as KEYS[1]).
-- `repeat` of another type is an error before any write (specs written and never scheduled); a
-- `repeat:paused` of another type holds no paused spec and is skipped.
--#include key_types
local refused = wrong_type('upsert_repeatable', {KEYS[1], 'zset'})
if refused then
  return refused
end
local base, width = ARGV[1], tonumber(ARGV[2])
local scored, m, n = {}, 0, 0
for i = 3, #ARGV, width do
  local key = ARGV[i + 1]
  local hash = base .. key
  if width == 4 and ARGV[i + 3] ~= '' then
    if type(redis.pcall('HSET', hash, 'spec', ARGV[i + 2], 'ext', ARGV[i + 3])) == 'table' then
      redis.call('DEL', hash)  -- a key of another type where the spec hash goes: replaced
      redis.call('HSET', hash, 'spec', ARGV[i + 2], 'ext', ARGV[i + 3])
    end
  else
    local added = redis.pcall('HSET', hash, 'spec', ARGV[i + 2])
    if type(added) == 'table' then
      redis.call('DEL', hash)
      redis.call('HSET', hash, 'spec', ARGV[i + 2])
    elseif added == 0 then
      redis.call('HDEL', hash, 'ext')
    end
  end
  scored[m + 1] = ARGV[i]
  scored[m + 2] = key
  m = m + 2
  n = n + 1
  if m == 2000 then
    redis.call('ZADD', KEYS[1], unpack(scored))
    scored, m = {}, 0
  end
end
if m > 0 then
  redis.call('ZADD', KEYS[1], unpack(scored, 1, m))
end
if n > 0 and redis.call('TYPE', KEYS[2]).ok == 'zset' then
  local keys = {}
  for i = 3, #ARGV, width do
    keys[#keys + 1] = ARGV[i + 1]
    if #keys == 1000 then
      redis.call('ZREM', KEYS[2], unpack(keys))
      keys = {}
    end
  end
  if #keys > 0 then
    redis.call('ZREM', KEYS[2], unpack(keys))
  end
end
return n
