-- dead_letter: move a stream entry to the DLQ atomically (ChasquiMQ pipelines this; one
-- script makes it exactly-once): ack + delete, XADD to the DLQ with the exact reason, and
-- the `failed` (when a handler ran) and `dlq` events; optionally a failure record.
-- KEYS[1] = stream   KEYS[2] = dlq   KEYS[3] = events
-- ARGV    = [group, entry_id, use_xackdel (0|1), dlq_max_len, events_max_len (0 = off), now_ms,
--            payload ("" with reason oversize_payload: the entry's own `d`, copied here), name, reason, detail, job_id, attempt, failed_reason ("" = no handler run),
--            duration_us, failure_ttl_ms (0 = no record), key_prefix, failures_max_len,
--            dlq_name (the DLQ's `n` when it is not `name`: an entry's original bytes; "" = name),
--            traceback (the handler's formatted traceback; "" = none: the DLQ's `detail` when there
--            is no other detail, and the failure record's 4th element)]
-- Reply   = 1 dead-lettered, 0 the entry was no longer pending; an error, nothing acked, when the
--           stream or the DLQ is of another type (an acked entry must reach the DLQ); an events
--           key or a failures index of another type is skipped
--#include key_types
--#include events
local refused = wrong_type('dead_letter', {KEYS[1], 'stream', KEYS[2], 'stream+'})
if refused then
  return refused
end
-- an oversize entry's call carries no payload: its `d` is copied from the entry, before the ack
local payload = ARGV[7]
if payload == '' and ARGV[9] == 'oversize_payload' then
  local e = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])[1]
  if e then
    for j = 1, #e[2], 2 do if e[2][j] == 'd' then payload = e[2][j + 1] end end
  end
end
local ok
if ARGV[3] == '1' then
  local r = redis.call('XACKDEL', KEYS[1], ARGV[1], 'IDS', 1, ARGV[2])
  ok = tonumber(r[1]) == 1 or tonumber(r[1]) == 2
else
  ok = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 1
  if ok then redis.call('XDEL', KEYS[1], ARGV[2]) end
end
if not ok then
  return 0
end
local d = {'XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'd', payload}
local dlq_name = ARGV[18] ~= '' and ARGV[18] or ARGV[8]
if dlq_name ~= '' then d[#d + 1] = 'n'; d[#d + 1] = dlq_name end
for _, v in ipairs({'source_id', ARGV[2], 'reason', ARGV[9]}) do d[#d + 1] = v end
local tb = ARGV[19] or ''
if ARGV[10] ~= '' then d[#d + 1] = 'detail'; d[#d + 1] = ARGV[10]
elseif tb ~= '' then d[#d + 1] = 'detail'; d[#d + 1] = tb end
redis.call(unpack(d))
local job_id = ARGV[11]
local events_max = events_max_for(KEYS[3], tonumber(ARGV[5]))
if events_max > 0 then
  local function event(kind, extra)
    local a = {KEYS[3], 'MAXLEN', '~', events_max, '*', 'e', kind, 'id', job_id, 'ts', ARGV[6]}
    if ARGV[8] ~= '' and job_id ~= '' then a[#a + 1] = 'n'; a[#a + 1] = ARGV[8] end
    for _, v in ipairs(extra) do a[#a + 1] = v end
    emit(unpack(a))
  end
  if ARGV[13] ~= '' then
    event('failed', {'attempt', ARGV[12], 'reason', ARGV[13], 'duration_us', ARGV[14]})
  end
  event('dlq', {'attempt', ARGV[12], 'reason', ARGV[9]})
end
if tonumber(ARGV[15]) > 0 and job_id ~= '' then
  -- the record's detail: the DLQ detail, else the handler's error (our key, not on the wire)
  local detail = ARGV[10]
  if detail == '' then detail = ARGV[13] end
  local record
  if tb ~= '' then record = cmsgpack.pack({ARGV[9], detail, tonumber(ARGV[6]), tb})
  else record = cmsgpack.pack({ARGV[9], detail, tonumber(ARGV[6])}) end
  redis.call('SET', ARGV[16] .. ':failure:' .. job_id, record, 'PX', ARGV[15])
  -- capped by count too, as in fail_batch.lua (one record here: trim at most a few)
  local index = ARGV[16] .. ':failures'
  local it = redis.call('TYPE', index).ok
  if it == 'zset' or it == 'none' then
    redis.call('ZADD', index, ARGV[6], job_id)
    local over = redis.call('ZCARD', index) - tonumber(ARGV[17])
    if over > 0 then
      local gone = redis.call('ZPOPMIN', index, math.min(over, 64))
      for k = 1, #gone, 2 do redis.call('DEL', ARGV[16] .. ':failure:' .. gone[k]) end
    end
    redis.call('PEXPIRE', index, ARGV[15])
  end
end
return 1
