-- schedule_batch: fire a batch of due repeatable specs in one call (wire spec 11.10 per spec),
-- each guarded by a compare-and-set on its score: the score the scheduler read is the fire's
-- identity (spec key + scheduled time), so two schedulers at once, or an update that moved
-- the timeline, can never fire the same window twice.
-- KEYS[1] = stream   KEYS[2] = delayed   KEYS[3] = repeat   KEYS[4] = repeat:quarantine
-- ARGV[1] = now_ms   ARGV[2] = max_stream_len
-- ARGV[3] = spec hash prefix (<prefix>:repeat:spec:, same hash slot as KEYS[3])
-- ARGV[4] = m, the number of specs; ARGV[5 .. 4 + m] = their keys; then per spec, in the
--           same order, an entry:
--   'f' expected next_fire_ms name envelope      the common case: one fire, due now, at the
--                                                score read; no limit, no end_before, a next fire
--   'F' expected next_fire_ms (0 = none) limit (0 = none) end_before_ms (0 = none) name n
--       then n pairs (fire_at_ms, envelope) in chronological order; envelope "" = a fire past
--       the spec's execution deadline: skipped and counted (HINCRBY skipped)
--   'D' expected                                 drop a dangling entry (no spec in the hash)
--   'Q' expected raw_spec_bytes_read             quarantine an undecodable spec
-- Reply = {fired, skipped, removed, lost, status_1, ..., status_m}
--   status_i: -1 the compare-and-set failed (nothing done), else fired_i * 2 + removed_i
--   ('D' and 'Q' report removed_i = 1 when they acted)
local now = tonumber(ARGV[1])
local maxlen = ARGV[2]
local base = ARGV[3]
local m = tonumber(ARGV[4])
local fired_total, skipped_total, removed_total, lost_total = 0, 0, 0, 0
local out = {0, 0, 0, 0}
local rescore, r = {}, 0
local i = 5 + m

local function emit(name, at, env)
  if tonumber(at) <= now then
    if name == '' then
      redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'd', env)
    else
      redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'd', env, 'n', name)
    end
  else
    local len = #name
    local prefix = string.char(len % 256, math.floor(len / 256) % 256, math.floor(len / 65536) % 256,
      math.floor(len / 16777216) % 256)
    redis.call('ZADD', KEYS[2], at, prefix .. name .. env)
  end
end

for s = 1, m do
  local key = ARGV[4 + s]
  local op, expected = ARGV[i], ARGV[i + 1]
  local score = redis.call('ZSCORE', KEYS[3], key)  -- (not ZMSCORE: the documented ACL grant lacks it)
  -- the score as this server formats it, sent back verbatim: equal strings are equal scores
  local ok = score == expected or (score and tonumber(score) == tonumber(expected))
  local status = -1
  if op == 'f' then
    if ok then
      local name = ARGV[i + 3]
      if name == '' then
        redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'd', ARGV[i + 4])
      else
        redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'd', ARGV[i + 4], 'n', name)
      end
      redis.call('HINCRBY', base .. key, 'fired', 1)
      rescore[r + 1] = ARGV[i + 2]
      rescore[r + 2] = key
      r = r + 2
      fired_total = fired_total + 1
      status = 2
    end
    i = i + 5
  elseif op == 'F' then
    local nxt_arg = ARGV[i + 2]
    local nxt, limit, endb = tonumber(nxt_arg), tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])
    local name, n = ARGV[i + 5], tonumber(ARGV[i + 6])
    local first = i + 7
    i = first + 2 * n
    if ok then
      local hash = base .. key
      local fired, hit = 0, false
      for j = first, i - 1, 2 do
        local env = ARGV[j + 1]
        if env == '' then
          redis.call('HINCRBY', hash, 'skipped', 1)
          skipped_total = skipped_total + 1
        else
          if limit > 0 and tonumber(redis.call('HGET', hash, 'fired') or '0') >= limit then
            hit = true
            break
          end
          emit(name, ARGV[j], env)
          redis.call('HINCRBY', hash, 'fired', 1)
          fired = fired + 1
        end
      end
      local done = hit or nxt <= 0 or (endb > 0 and nxt > endb)
      if not done and limit > 0 then
        done = tonumber(redis.call('HGET', hash, 'fired') or '0') >= limit
      end
      local removed = 0
      if done then
        redis.call('ZREM', KEYS[3], key)
        redis.call('DEL', hash)
        removed = 1
      else
        rescore[r + 1] = nxt_arg
        rescore[r + 2] = key
        r = r + 2
      end
      fired_total = fired_total + fired
      removed_total = removed_total + removed
      status = fired * 2 + removed
    end
  elseif op == 'D' then
    i = i + 2
    -- no stored spec (a hash left with only other fields counts too: it would stay due for ever)
    if ok and redis.call('HEXISTS', base .. key, 'spec') == 0 then
      redis.call('ZREM', KEYS[3], key)
      redis.call('DEL', base .. key)
      removed_total = removed_total + 1
      status = 1
    end
  elseif op == 'Q' then
    local bad = ARGV[i + 2]
    i = i + 3
    if ok then
      local hash = base .. key
      local raw = redis.call('HGET', hash, 'spec')
      if raw and raw == bad then
        redis.call('HSET', KEYS[4], key, raw)
        redis.call('ZREM', KEYS[3], key)
        redis.call('DEL', hash)
        removed_total = removed_total + 1
        status = 1
      end
    end
  else
    return redis.error_reply('schedule_batch: unknown op ' .. tostring(op))
  end
  if status < 0 then
    lost_total = lost_total + 1
  end
  out[4 + s] = status
end
-- every kept spec's next fire, in one ZADD per 1,000 (no spec appears twice in a batch)
for k = 1, r, 2000 do
  redis.call('ZADD', KEYS[3], unpack(rescore, k, math.min(r, k + 1999)))
end
out[1], out[2], out[3], out[4] = fired_total, skipped_total, removed_total, lost_total
return out
