-- retry: move a failed job back to the delayed set for another attempt (wire spec 11.2),
-- gated on the ack so a repeated call cannot schedule twice; writes `failed` and
-- `retry-scheduled` events in the same round trip.
-- KEYS[1] = stream   KEYS[2] = delayed   KEYS[3] = events
-- ARGV    = [group, entry_id, run_at_ms, member, use_xackdel (0|1), events_max_len (0 = off),
--            now_ms, job_id, name, failed_attempt, reason, duration_us, next_attempt, backoff_ms]
-- Reply   = 1 rescheduled, 0 the entry was no longer pending (someone else handled it)
local ok
if ARGV[5] == '1' then
  local r = redis.call('XACKDEL', KEYS[1], ARGV[1], 'IDS', 1, ARGV[2])
  ok = tonumber(r[1]) == 1 or tonumber(r[1]) == 2
else
  ok = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 1
  if ok then redis.call('XDEL', KEYS[1], ARGV[2]) end
end
if not ok then
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
local events_max = tonumber(ARGV[6])
if events_max > 0 then  -- direct calls: no argument tables built per event
  local ev, m, id, ts = KEYS[3], events_max, ARGV[8], ARGV[7]
  if ARGV[9] == '' then
    redis.call('XADD', ev, 'MAXLEN', '~', m, '*', 'e', 'failed', 'id', id, 'ts', ts,
      'attempt', ARGV[10], 'reason', ARGV[11], 'duration_us', ARGV[12])
    redis.call('XADD', ev, 'MAXLEN', '~', m, '*', 'e', 'retry-scheduled', 'id', id, 'ts', ts,
      'attempt', ARGV[13], 'backoff_ms', ARGV[14])
  else
    redis.call('XADD', ev, 'MAXLEN', '~', m, '*', 'e', 'failed', 'id', id, 'ts', ts, 'n', ARGV[9],
      'attempt', ARGV[10], 'reason', ARGV[11], 'duration_us', ARGV[12])
    redis.call('XADD', ev, 'MAXLEN', '~', m, '*', 'e', 'retry-scheduled', 'id', id, 'ts', ts, 'n', ARGV[9],
      'attempt', ARGV[13], 'backoff_ms', ARGV[14])
  end
end
return 1
