-- schedule_batch: fire a batch of due repeatable specs in one call (wire spec 11.10 per spec),
-- each guarded by a compare-and-set on its score: the score the scheduler read is the fire's
-- identity (spec key + scheduled time), so two schedulers at once, or an update that moved
-- the timeline, can never fire the same window twice.
-- KEYS[1] = stream   KEYS[2] = delayed   KEYS[3] = repeat   KEYS[4] = repeat:quarantine
-- KEYS[4 + i] = repeat:spec:<key_i>
-- ARGV[1] = now_ms   ARGV[2] = max_stream_len
-- then per spec i a header of 8 values:
--   op      'F' fire | 'D' drop a dangling entry (no spec hash) | 'Q' quarantine (undecodable)
--   key, expected_score (as read), next_fire_ms (0 = none), limit (0 = none),
--   end_before_ms (0 = none), name ('Q': the raw spec bytes read), n
-- followed by n pairs (fire_at_ms, envelope) in chronological order; envelope "" = a fire
-- past the spec's execution deadline: skipped and counted (HINCRBY skipped).
-- Reply = {fired, skipped, removed, lost, status_1, ..., status_m}
--   status_i: -1 the compare-and-set failed (nothing done), else fired_i * 2 + removed_i
--   ('D' and 'Q' report removed_i = 1 when they acted)
local now = tonumber(ARGV[1])
local maxlen = ARGV[2]
local fired_total, skipped_total, removed_total, lost_total = 0, 0, 0, 0
local statuses = {}
local rescore = {}
local i, s = 3, 0
while i <= #ARGV do
  s = s + 1
  local op, key, expected = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local nxt_arg = ARGV[i + 3]
  local nxt, limit, endb = tonumber(nxt_arg), tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5])
  local name, n = ARGV[i + 6], tonumber(ARGV[i + 7])
  local hash = KEYS[4 + s]
  local first = i + 8
  i = first + 2 * n
  local status = -1
  local score = redis.call('ZSCORE', KEYS[3], key)
  if score and tonumber(score) == tonumber(expected) then
    if op == 'F' then
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
          local at = ARGV[j]
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
        rescore[#rescore + 1] = nxt_arg
        rescore[#rescore + 1] = key
      end
      fired_total = fired_total + fired
      removed_total = removed_total + removed
      status = fired * 2 + removed
    elseif op == 'D' then
      -- no stored spec (a hash left with only other fields counts too: it would stay due for ever)
      if redis.call('HEXISTS', hash, 'spec') == 0 then
        redis.call('ZREM', KEYS[3], key)
        redis.call('DEL', hash)
        removed_total = removed_total + 1
        status = 1
      end
    elseif op == 'Q' then
      local raw = redis.call('HGET', hash, 'spec')
      if raw and raw == name then
        redis.call('HSET', KEYS[4], key, raw)
        redis.call('ZREM', KEYS[3], key)
        redis.call('DEL', hash)
        removed_total = removed_total + 1
        status = 1
      end
    end
  end
  if status < 0 then
    lost_total = lost_total + 1
  end
  statuses[s] = status
end
-- every kept spec's next fire, in one ZADD per 1,000 (no spec appears twice in a batch)
for k = 1, #rescore, 2000 do
  redis.call('ZADD', KEYS[3], unpack(rescore, k, math.min(#rescore, k + 1999)))
end
local out = {fired_total, skipped_total, removed_total, lost_total}
for k = 1, s do
  out[4 + k] = statuses[k]
end
return out
