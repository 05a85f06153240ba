-- add_dedup: add a job under a deduplication id (issue 25, core/dedup.py).
--   throttle: while the id's marker lives (ttl_ms after the first add), a repeat adds nothing;
--             the first job's id is returned and a `deduplicated` event written.
--   debounce: the job is delayed by ttl_ms; a repeat while the previous one still waits in the
--             delayed set replaces it (the new data, the start pushed back to now + ttl_ms): the
--             old member leaves, a `deduplicated` event names it and its replacement.
-- A marker of another type (hostile) is replaced: the add proceeds as the first one.
-- KEYS[1] = {chasqui:<q>}:dedup:<id> (hash: job, member)   KEYS[2] = stream   KEYS[3] = delayed
-- KEYS[4] = events
-- ARGV    = [mode, ttl_ms, job_id, max_stream_len, envelope, name, member, events_max (0 = off),
--            dedup_id]
-- Reply   = {1, job_id} added, {0, first_job_id} throttled, {2, job_id} added replacing a waiting one
-- The key this mode writes (throttle: the stream, debounce: the delayed set) of another type is an
-- error before the marker is touched.
--#include key_types
--#include events
local refused = wrong_type('add_dedup', ARGV[1] == 'throttle' and {KEYS[2], 'stream+'} or {KEYS[3], 'zset'})
if refused then
  return refused
end
local mode, ttl, jid = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local events_max = tonumber(ARGV[8])
local kt = redis.call('TYPE', KEYS[1])['ok']
if kt ~= 'hash' and kt ~= 'none' then redis.call('DEL', KEYS[1]) end
local et = redis.call('TYPE', KEYS[4])['ok']
if et ~= 'stream' and et ~= 'none' then events_max = 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function deduplicated(old, extra)
  if events_max > 0 then
    if extra then
      emit(KEYS[4], 'MAXLEN', '~', events_max, '*', 'e', 'deduplicated', 'id', old, 'ts', now,
        'dedup_id', ARGV[9], 'mode', mode, 'replaced_by', extra)
    else
      emit(KEYS[4], 'MAXLEN', '~', events_max, '*', 'e', 'deduplicated', 'id', old, 'ts', now,
        'dedup_id', ARGV[9], 'mode', mode)
    end
  end
end
local old = redis.call('HGET', KEYS[1], 'job')
if mode == 'throttle' then
  if old then
    deduplicated(old, nil)
    return {0, old}
  end
  if ARGV[6] == '' then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'd', ARGV[5])
  else
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'd', ARGV[5], 'n', ARGV[6])
  end
  redis.call('HSET', KEYS[1], 'job', jid)
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, jid}
end
local status = 1
if old then
  local member = redis.call('HGET', KEYS[1], 'member')
  if member and redis.call('ZREM', KEYS[3], member) == 1 then
    status = 2
    deduplicated(old, jid)
  end
end
redis.call('ZADD', KEYS[3], now + ttl, ARGV[7])
redis.call('HSET', KEYS[1], 'job', jid, 'member', ARGV[7])
redis.call('PEXPIRE', KEYS[1], ttl + 60000)
return {status, jid}
