-- fail_batch: the worker's failed jobs, up to a batch per round trip.  A 'r' entry is wire spec
-- 11.2's retry (ack, then ZADD of the next attempt's member, with the `failed` and
-- `retry-scheduled` events); a 'd' entry does what dead_letter.lua does (same DLQ fields,
-- reasons, events, failure records).  Each only if this call acked its entry: a repeat (a
-- client retry after a lost reply, a job another consumer already handled) writes nothing.
-- KEYS[1] = stream   KEYS[2] = delayed   KEYS[3] = dlq   KEYS[4] = events
-- ARGV    = [group, use_xackdel (0|1), events_max_len (0 = off), dlq_max_len,
--            failure_ttl_ms (0 = no records), key_prefix, now_ms, failures_max_len, then 12 per
--            entry of kind 'r' (retry) or 'd' (DLQ):
--   12 per entry 'r': kind, entry_id, job_id, name, attempt, failed_reason, duration_us, run_at_ms, member, next_attempt, backoff_ms, traceback
--   12 per entry 'd': kind, entry_id, job_id, name, attempt, failed_reason, duration_us, payload, dlq_reason, detail, dlq_name, traceback
--            (payload "" with dlq_reason oversize_payload: the entry's own `d`, copied here)
--            ]  failed_reason "" = no handler ran; dlq_name = the DLQ's `n` when it is not `name`
--            (an entry's original bytes; "" = name); traceback = the handler's formatted
--            traceback ("" = none; used by kind 'd' only)
-- A traceback goes to the DLQ's optional `detail` field when there is no other detail (the
-- field ChasquiMQ's readers already accept) and to the failure record as a 4th element.
-- Reply   = per entry, 1 rescheduled or dead-lettered, 0 no longer pending (nothing written)
-- Failure records are capped by count as well as TTL, like results in complete_batch.lua
-- (index `<prefix>:failures`).
--#include acks
--#include events
--#include key_types
local group, xackdel = ARGV[1], ARGV[2] == '1'
local events_max, dlq_max = tonumber(ARGV[3]), ARGV[4]
local ttl, prefix, now = tonumber(ARGV[5]), ARGV[6], ARGV[7]
local failures_max = tonumber(ARGV[8])
local stream, delayed, dlq, ev = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
-- Scripts do not roll back: a write that fails after an entry was acked would lose it.  So a
-- wrong-typed retry or DLQ key, or a full DLQ (include/key_types.lua), refuses the whole call
-- before any write (the entries stay pending, and the error names the key); wrong-typed
-- events or index keys are only skipped, and a full events stream ends the events.
-- Only the keys this batch writes are checked: a spoiled DLQ does not hold up retries, nor a
-- spoiled delayed set the dead-lettering.
local function type_of(key) return redis.call('TYPE', key)['ok'] end
local kinds = {}
for i = 9, #ARGV, 12 do kinds[ARGV[i]] = true end
local dt = kinds['r'] and type_of(delayed) or 'none'
local qt = kinds['d'] and type_of(dlq) or 'none'
if dt ~= 'zset' and dt ~= 'none' then
  return redis.error_reply('WRONGTYPE chasqui fail_batch: ' .. delayed .. ' is a ' .. dt ..
    ' (expected a zset); nothing was acked')
end
if qt ~= 'stream' and qt ~= 'none' then
  return redis.error_reply('WRONGTYPE chasqui fail_batch: ' .. dlq .. ' is a ' .. qt ..
    ' (expected a stream); nothing was acked')
end
if qt == 'stream' and stream_full(dlq) then
  return redis.error_reply('chasqui fail_batch: ' .. dlq .. ' is full (its last id is the largest a ' ..
    'stream can hold, so XADD cannot add to it); nothing was acked')
end
local et = type_of(ev)
if et ~= 'stream' and et ~= 'none' then events_max = 0 end
local index_ok = (function(t) return t == 'zset' or t == 'none' end)(type_of(prefix .. ':failures'))
local out = {}
local stored = {}  -- score, id pairs for the failures index

-- An oversize entry's row carries no payload (it never crosses the network twice): its `d` is
-- copied from the entry itself, read here before anything is deleted.
local payloads = {}
for i = 9, #ARGV, 12 do
  if ARGV[i] == 'd' and ARGV[i + 7] == '' and ARGV[i + 8] == 'oversize_payload' then
    local e = redis.call('XRANGE', stream, ARGV[i + 1], ARGV[i + 1])[1]
    if e then
      for j = 1, #e[2], 2 do if e[2][j] == 'd' then payloads[i] = e[2][j + 1] end end
    end
  end
end

-- XACKDEL (Redis 8.2+): one call per 500 ids; on 7.0 each entry is XACKed in the loop and the
-- acked ones deleted together at the end (delete_acked; both in include/acks.lua).
local codes
if xackdel then
  local ids = {}
  for i = 9, #ARGV, 12 do ids[#ids + 1] = ARGV[i + 1] end
  codes = xackdel_codes(stream, group, ids)
end

local done, n = {}, 0  -- entries XACKed here (7.0 path), deleted at the end
local retries = {}  -- score, member pairs for the delayed set, added together after the loop
local evented = false  -- events are trimmed once, at the end (MAXLEN ~ per XADD costs more)
for i = 9, #ARGV, 12 do
  local eid = ARGV[i + 1]
  local ok
  if xackdel then
    ok = codes[#out + 1] == 1 or codes[#out + 1] == 2
  else
    ok = redis.call('XACK', stream, group, eid) == 1
    if ok then n = n + 1; done[n] = eid end
  end
  out[#out + 1] = ok and 1 or 0
  local payload = payloads[i] or ARGV[i + 7]
  if ok then
    local kind, id, name, attempt = ARGV[i], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
    local failed, dur = ARGV[i + 5], ARGV[i + 6]
    evented = evented or events_max > 0
    if kind == 'r' then  -- retry (wire spec 11.2)
      retries[#retries + 1] = ARGV[i + 7]; retries[#retries + 1] = ARGV[i + 8]  -- one ZADD below
      if events_max > 0 then
        if name == '' then
          emit(ev, '*', 'e', 'failed', 'id', id, 'ts', now,
            'attempt', attempt, 'reason', failed, 'duration_us', dur)
          emit(ev, '*', 'e', 'retry-scheduled', 'id', id, 'ts', now,
            'attempt', ARGV[i + 9], 'backoff_ms', ARGV[i + 10])
        else
          emit(ev, '*', 'e', 'failed', 'id', id, 'ts', now, 'n', name,
            'attempt', attempt, 'reason', failed, 'duration_us', dur)
          emit(ev, '*', 'e', 'retry-scheduled', 'id', id, 'ts', now,
            'n', name, 'attempt', ARGV[i + 9], 'backoff_ms', ARGV[i + 10])
        end
      end
    else  -- dead_letter.lua
      local reason, detail = ARGV[i + 8], ARGV[i + 9]
      local d = {'XADD', dlq, 'MAXLEN', '~', dlq_max, '*', 'd', payload}
      local dlq_name = ARGV[i + 10] ~= '' and ARGV[i + 10] or name
      if dlq_name ~= '' then d[#d + 1] = 'n'; d[#d + 1] = dlq_name end
      d[#d + 1] = 'source_id'; d[#d + 1] = eid; d[#d + 1] = 'reason'; d[#d + 1] = reason
      local tb = ARGV[i + 11]
      if detail ~= '' then d[#d + 1] = 'detail'; d[#d + 1] = detail
      elseif tb ~= '' then d[#d + 1] = 'detail'; d[#d + 1] = tb end
      redis.call(unpack(d))
      if events_max > 0 then
        local named = name ~= '' and id ~= ''
        if failed ~= '' then
          if named then
            emit(ev, '*', 'e', 'failed', 'id', id, 'ts', now, 'n', name,
              'attempt', attempt, 'reason', failed, 'duration_us', dur)
          else
            emit(ev, '*', 'e', 'failed', 'id', id, 'ts', now,
              'attempt', attempt, 'reason', failed, 'duration_us', dur)
          end
        end
        if named then
          emit(ev, '*', 'e', 'dlq', 'id', id, 'ts', now, 'n', name,
            'attempt', attempt, 'reason', reason)
        else
          emit(ev, '*', 'e', 'dlq', 'id', id, 'ts', now,
            'attempt', attempt, 'reason', reason)
        end
      end
      if ttl > 0 and id ~= '' then
        -- the record's detail: the DLQ detail, else the handler's error (our key, not on the wire)
        if detail == '' then detail = failed end
        local record
        if tb ~= '' then record = cmsgpack.pack({reason, detail, tonumber(now), tb})
        else record = cmsgpack.pack({reason, detail, tonumber(now)}) end
        redis.call('SET', prefix .. ':failure:' .. id, record, 'PX', ttl)
        stored[#stored + 1] = now; stored[#stored + 1] = id
      end
    end
  end
end
for k = 1, #retries, 1000 do
  redis.call('ZADD', delayed, unpack(retries, k, math.min(k + 999, #retries)))
end
if evented then
  redis.call('XTRIM', ev, 'MAXLEN', '~', events_max)
end
if #stored > 0 and index_ok then
  local index = prefix .. ':failures'
  for k = 1, #stored, 1000 do
    redis.call('ZADD', index, unpack(stored, k, math.min(k + 999, #stored)))
  end
  local over = redis.call('ZCARD', index) - failures_max
  if over > 0 then
    local gone = redis.call('ZPOPMIN', index, math.min(over, #stored / 2 + 64))
    local keys = {}
    for k = 1, #gone, 2 do keys[#keys + 1] = prefix .. ':failure:' .. gone[k] end
    for k = 1, #keys, 500 do
      redis.call('DEL', unpack(keys, k, math.min(k + 499, #keys)))
    end
  end
  redis.call('PEXPIRE', index, ttl)
end
delete_acked(stream, group, done, n)
return out
