-- schedule_batch: fire a batch of due repeatable specs in one call (wire spec 11.10 per spec),
-- each guarded by a compare-and-set on its score: the score the scheduler read is the fire's
-- identity (spec key + scheduled time), so two schedulers at once, or an update that moved
-- the timeline, can never fire the same window twice.
-- KEYS[1] = stream   KEYS[2] = delayed   KEYS[3] = repeat   KEYS[4] = repeat:quarantine
-- KEYS[5] = controls hash   KEYS[6] = prioritized   KEYS[7] = groups   (for op 'S' only)
-- KEYS[8] = events   (for op 'U' only)
-- ARGV[1] = now_ms   ARGV[2] = max_stream_len
-- ARGV[3] = spec hash prefix (<prefix>:repeat:spec:, same hash slot as KEYS[3])
-- ARGV[4] = m, the number of specs; ARGV[5 .. 4 + m] = their keys; then per spec, in the
--           same order, an entry:
--   5 per spec 'f': op, expected, next_fire_ms, name, envelope   (op = 'f') the common case:
--       one fire, due now, at the score read; no limit, no end_before, a next fire
--   'F' expected next_fire_ms (0 = none) limit (0 = none) end_before_ms (0 = none) name n
--       then n pairs (fire_at_ms, envelope) in chronological order; envelope "" = a fire past
--       the spec's execution deadline: skipped and counted (HINCRBY skipped)
--   'S' expected next_fire_ms limit end_before_ms priority group_list group name n pairs:
--       an 'F' whose due fires wait beside the stream (issue 24), as add_prioritized.lua
--       (priority > 0) or add_grouped.lua (group_list = the group's list key) write them;
--       a fire not yet due goes to the delayed set as a plain job
--   'U' expected next_fire_ms limit end_before_ms mode ttl_ms marker dedup_id events_max name
--       n pairs, then the n fires' job ids: an 'F' whose due fires are added as add_dedup.lua
--       adds them (issue 25): throttle: a fire while the marker lives is skipped (counted in
--       `skipped`, a `deduplicated` event); debounce: the fire waits ttl_ms in the delayed set,
--       replacing the fire or job that still waits there
--   'D' expected                                 drop a dangling entry (no spec in the hash)
--   'Q' expected mode bytes                      quarantine a corrupt entry: mode 's' = its
--                                                stored spec still is `bytes`; 'x' = any content
-- Reply = {fired, skipped, removed, lost, status_1, ..., status_m, {i, reason, ...}}
--   status_i: -1 the compare-and-set failed (nothing done), else fired_i * 2 + removed_i
--   ('D' and 'Q' report removed_i = 1 when they acted); the last element lists the specs
--   quarantined here because their hash turned corrupt after the read (a counter HINCRBY
--   rejects, a key of another type): their fires so far stand and the spec is moved aside.
-- No command that can fail runs after a spec's first write: the hash commands are
-- redis.pcall'd and each counter is raised before its fire is written, so the rescoring ZADD
-- at the end, the fence of every fire, always runs (a script's writes are not rolled back).
--#include key_types
--#include events
local refused = wrong_type('schedule_batch', {KEYS[1], 'stream+', KEYS[2], 'zset', KEYS[3], 'zset', KEYS[4], 'hash'})
if refused then
  return refused
end
local now = tonumber(ARGV[1])
local maxlen = ARGV[2]
local base = ARGV[3]
local m = tonumber(ARGV[4])
local fired_total, skipped_total, removed_total, lost_total = 0, 0, 0, 0
local out = {0, 0, 0, 0}
local rescore, r = {}, 0
local corrupt = {}
local i = 5 + m

local function failed(res)
  return type(res) == 'table' and res.err
end

-- move a spec aside: its stored bytes (when it still is a hash) into the quarantine hash
local function quarantine(key, hash)
  local raw = ''
  if redis.call('TYPE', hash).ok == 'hash' then
    raw = redis.call('HGET', hash, 'spec') or ''
  end
  redis.call('HSET', KEYS[4], key, raw)
  redis.call('ZREM', KEYS[3], key)
  redis.call('DEL', hash)
end

-- the spec's fired counter as a number, or nil when it is none (wrong type, not an integer)
local function fired_count(hash)
  local v = redis.pcall('HGET', hash, 'fired')
  if failed(v) then
    return nil
  end
  return tonumber(v or '0')
end

-- the side lanes' keys, checked once per call (a key of another type, hostile or foreign, is
-- replaced, as the add scripts do)
local side_checked = false
local function side_keys()
  if side_checked then
    return
  end
  side_checked = true
  for j, want in pairs({[5] = 'hash', [6] = 'zset', [7] = 'zset'}) do
    local kind = redis.call('TYPE', KEYS[j]).ok
    if kind ~= want and kind ~= 'none' then
      redis.call('DEL', KEYS[j])
    end
  end
end

--#include prio_seq

local function member_of(name, env)
  local len = #name
  return string.char(len % 256, math.floor(len / 256) % 256, math.floor(len / 65536) % 256,
    math.floor(len / 16777216) % 256) .. name .. env
end

-- a due fire of an 'S' entry: into the prioritized set, or its group's list
local function emit_side(name, env, priority, list, group)
  side_keys()
  if priority > 0 then
    local seq = take_seq(KEYS[5], KEYS[6], 1)
    redis.call('ZADD', KEYS[6], priority * 137438953472 + seq, member_of(name, env))
  else
    redis.call('HSET', KEYS[5], 'grouped', '1')
    local kind = redis.call('TYPE', list).ok
    if kind ~= 'list' and kind ~= 'none' then
      redis.call('DEL', list)
    end
    redis.call('RPUSH', list, member_of(name, env))
    if not redis.call('ZSCORE', KEYS[7], group) then
      local last = redis.call('ZRANGE', KEYS[7], -1, -1, 'WITHSCORES')
      redis.call('ZADD', KEYS[7], (tonumber(last[2]) or 0) + 1, group)
    end
  end
end

-- the `deduplicated` event of a 'U' entry's fire (d = {mode, ttl, marker, dedup_id,
-- events_max}): ``old`` the job that holds the window, ``by`` its replacement (debounce)
local function deduplicated(d, old, by)
  local events_max = tonumber(d[5])
  if events_max <= 0 then
    return
  end
  local et = redis.call('TYPE', KEYS[8]).ok
  if et ~= 'stream' and et ~= 'none' then
    return
  end
  local fields = {'e', 'deduplicated', 'id', old, 'ts', now, 'dedup_id', d[4], 'mode', d[1]}
  if by then
    fields[#fields + 1] = 'replaced_by'
    fields[#fields + 1] = by
  end
  emit(KEYS[8], 'MAXLEN', '~', events_max, '*', unpack(fields))
end

-- the job holding a throttle's window, or nil (a marker of another type is replaced first)
local function throttled(d)
  local marker = d[3]
  local kind = redis.call('TYPE', marker).ok
  if kind ~= 'hash' and kind ~= 'none' then
    redis.call('DEL', marker)
  end
  if d[1] ~= 'throttle' then
    return nil
  end
  return redis.call('HGET', marker, 'job')
end

local function emit(name, at, env, side)
  if side and tonumber(at) <= now then
    emit_side(name, env, side[1], side[2], side[3])
  elseif tonumber(at) <= now then
    if name == '' then
      redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'd', env)
    else
      redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'd', env, 'n', name)
    end
  else
    redis.call('ZADD', KEYS[2], at, member_of(name, env))
  end
end

-- a due fire of a 'U' entry that no throttle held back, written as add_dedup.lua writes a job
local function emit_dedup(name, env, jid, d)
  local marker, ttl = d[3], tonumber(d[2])
  if d[1] == 'throttle' then
    emit(name, now, env, nil)
    redis.call('HSET', marker, 'job', jid)
    redis.call('PEXPIRE', marker, ttl)
    return
  end
  local old = redis.call('HGET', marker, 'job')
  if old then
    local member = redis.call('HGET', marker, 'member')
    if member and redis.call('ZREM', KEYS[2], member) == 1 then
      deduplicated(d, old, jid)
    end
  end
  local m = member_of(name, env)
  redis.call('ZADD', KEYS[2], now + ttl, m)
  redis.call('HSET', marker, 'job', jid, 'member', m)
  redis.call('PEXPIRE', marker, ttl + 60000)
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
      local hash = base .. key
      local res = redis.pcall('HINCRBY', hash, 'fired', 1)
      if type(res) == 'table' then  -- an error reply (inlined `failed`: the hot path)
        quarantine(key, hash)
        corrupt[#corrupt + 1] = s
        corrupt[#corrupt + 1] = 'the fired counter: ' .. res.err
        removed_total = removed_total + 1
        status = 1
      else
        local name = ARGV[i + 3]
        if name == '' then
          redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'd', ARGV[i + 4])
        else
          redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'd', ARGV[i + 4], 'n', name)
        end
        rescore[r + 1] = ARGV[i + 2]
        rescore[r + 2] = key
        r = r + 2
        fired_total = fired_total + 1
        status = 2
      end
    end
    i = i + 5
  elseif op == 'F' or op == 'S' or op == 'U' then
    local nxt_arg = ARGV[i + 2]
    local nxt, limit, endb = tonumber(nxt_arg), tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])
    local side, dedup = nil, nil
    if op == 'S' then  -- three more: priority, group list key, group
      side = {tonumber(ARGV[i + 5]), ARGV[i + 6], ARGV[i + 7]}
      i = i + 3
    elseif op == 'U' then  -- five more: mode, ttl_ms, marker, dedup_id, events_max
      dedup = {ARGV[i + 5], ARGV[i + 6], ARGV[i + 7], ARGV[i + 8], ARGV[i + 9]}
      i = i + 5
    end
    local name, n = ARGV[i + 5], tonumber(ARGV[i + 6])
    local first = i + 7
    i = first + 2 * n
    local ids = i
    if dedup then
      i = i + n
    end
    if ok then
      local hash = base .. key
      local fired, hit, bad = 0, false, nil
      for j = first, ids - 1, 2 do
        local env = ARGV[j + 1]
        local old = nil
        if dedup and env ~= '' and tonumber(ARGV[j]) <= now then
          old = throttled(dedup)
        end
        if env == '' or old then  -- past its deadline, or throttled: skipped and counted
          local res = redis.pcall('HINCRBY', hash, 'skipped', 1)
          if failed(res) then
            bad = 'the skipped counter: ' .. res.err
            break
          end
          skipped_total = skipped_total + 1
          if old then
            deduplicated(dedup, old, nil)
          end
        else
          if limit > 0 then
            local count = fired_count(hash)
            if not count then
              bad = 'the fired counter is not an integer'
              break
            elseif count >= limit then
              hit = true
              break
            end
          end
          local res = redis.pcall('HINCRBY', hash, 'fired', 1)
          if failed(res) then
            bad = 'the fired counter: ' .. res.err
            break
          end
          if dedup and tonumber(ARGV[j]) <= now then
            emit_dedup(name, env, ARGV[ids + (j - first) / 2], dedup)
          else
            emit(name, ARGV[j], env, side)
          end
          fired = fired + 1
        end
      end
      local done = hit or nxt <= 0 or (endb > 0 and nxt > endb)
      if not done and not bad and limit > 0 then
        local count = fired_count(hash)
        done = count ~= nil and count >= limit
      end
      local removed = 0
      if bad then
        quarantine(key, hash)
        corrupt[#corrupt + 1] = s
        corrupt[#corrupt + 1] = bad
        removed = 1
      elseif done then
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
    if ok then
      local has = redis.pcall('HEXISTS', base .. key, 'spec')
      if failed(has) then  -- the key turned into another type since the read
        quarantine(key, base .. key)
        corrupt[#corrupt + 1] = s
        corrupt[#corrupt + 1] = has.err
        removed_total = removed_total + 1
        status = 1
      elseif has == 0 then
        redis.call('ZREM', KEYS[3], key)
        redis.call('DEL', base .. key)
        removed_total = removed_total + 1
        status = 1
      end
    end
  elseif op == 'Q' then
    local mode, bad = ARGV[i + 2], ARGV[i + 3]
    i = i + 4
    if ok then
      local hash = base .. key
      local raw = mode == 's' and redis.pcall('HGET', hash, 'spec')
      if mode ~= 's' or raw == bad then  -- 's': unless an upsert rewrote the spec since the read
        quarantine(key, hash)
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
out[5 + m] = corrupt
return out
