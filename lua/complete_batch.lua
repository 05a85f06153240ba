-- complete_batch: ack a batch of finished jobs and record their outcome in one round trip:
-- XACK + XDEL (or XACKDEL on Redis 8.2+), `completed` events, opt-in result keys.
-- KEYS[1] = stream   KEYS[2] = events
-- ARGV    = [group, use_xackdel (0|1), events_max_len (0 = off), result_ttl_ms (0 = no results),
--            key_prefix, now_ms, results_max_len,
--            then 6 per job: entry_id, job_id, name, attempt, duration_us, result]
--           (result "" = nothing to store)
-- Reply   = number of entries acknowledged
-- A job gets its `completed` event (and result) only if this call acknowledged its entry.
-- Results are bounded by count as well as by TTL: `<prefix>:results` (ZSET, score = time
-- stored) indexes them, and the oldest beyond results_max_len are deleted here, a few more
-- than this call stored at most (amortised: a lowered limit is reached over a few calls).
--#include acks
--#include events
local group, xackdel = ARGV[1], ARGV[2] == '1'
local events_max, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local prefix, now, results_max = ARGV[5], ARGV[6], tonumber(ARGV[7])
local stream, events = KEYS[1], KEYS[2]
-- Scripts do not roll back, and the acks come first: a wrong-typed events or index key is
-- skipped (those writes are best effort) rather than failing after the acks.
local function type_of(key) return redis.call('TYPE', key)['ok'] end
if events_max > 0 then
  local et = type_of(events)
  if et ~= 'stream' and et ~= 'none' then events_max = 0 end
end
-- (the index is only written when results are stored: no TYPE call otherwise)
local index_ok = ttl > 0 and (function(t) return t == 'zset' or t == 'none' end)(type_of(prefix .. ':results'))
local row0, last = 8, #ARGV
local acked = 0
local stored = {}  -- score, id pairs for the results index

-- XACKDEL (Redis 8.2+): one call per 500 ids instead of one per job (include/acks.lua).
local codes
if xackdel then
  local ids = {}
  for i = row0, last, 6 do ids[#ids + 1] = ARGV[i] end
  codes = xackdel_codes(stream, group, ids)
end

local done, n = {}, 0  -- entries XACKed here (7.0 path), deleted below
local j = 0
for i = row0, last, 6 do
  j = j + 1
  local ok
  if xackdel then
    ok = codes[j] == 1 or codes[j] == 2
  else
    ok = redis.call('XACK', stream, group, ARGV[i]) == 1
    if ok then n = n + 1; done[n] = ARGV[i] end
  end
  if ok then
    acked = acked + 1
    local id, name = ARGV[i + 1], ARGV[i + 2]
    if ttl > 0 and ARGV[i + 5] ~= '' then
      redis.call('SET', prefix .. ':result:' .. id, ARGV[i + 5], 'PX', ttl)
      stored[#stored + 1] = now; stored[#stored + 1] = id
    end
    -- MAXLEN ~ once per batch (below), not per XADD: the same whole nodes go, for less.
    if events_max > 0 then
      if name == '' then
        emit(events, '*', 'e', 'completed', 'id', id, 'ts', now,
          'attempt', ARGV[i + 3], 'duration_us', ARGV[i + 4])
      else
        emit(events, '*', 'e', 'completed', 'id', id, 'ts', now,
          'n', name, 'attempt', ARGV[i + 3], 'duration_us', ARGV[i + 4])
      end
    end
  end
end
if acked > 0 and events_max > 0 then
  redis.call('XTRIM', events, 'MAXLEN', '~', events_max)
end
if #stored > 0 and index_ok then
  local index = prefix .. ':results'
  for k = 1, #stored, 1000 do
    redis.call('ZADD', index, unpack(stored, k, math.min(k + 999, #stored)))
  end
  local over = redis.call('ZCARD', index) - results_max
  if over > 0 then
    local gone = redis.call('ZPOPMIN', index, math.min(over, #stored / 2 + 64))
    local keys = {}
    for k = 1, #gone, 2 do keys[#keys + 1] = prefix .. ':result:' .. gone[k] end
    for k = 1, #keys, 500 do
      redis.call('DEL', unpack(keys, k, math.min(k + 499, #keys)))
    end
  end
  redis.call('PEXPIRE', index, ttl)  -- it goes with the results it indexes when the queue idles
end
delete_acked(stream, group, done, n)
return acked
