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
if events_max > 0 then
  local name_f = {}
  if ARGV[9] ~= '' then name_f = {'n', ARGV[9]} end
  local a = {'XADD', KEYS[3], 'MAXLEN', '~', events_max, '*', 'e', 'failed', 'id', ARGV[8], 'ts', ARGV[7]}
  for _, v in ipairs(name_f) do a[#a + 1] = v end
  for _, v in ipairs({'attempt', ARGV[10], 'reason', ARGV[11], 'duration_us', ARGV[12]}) do a[#a + 1] = v end
  redis.call(unpack(a))
  local b = {'XADD', KEYS[3], 'MAXLEN', '~', events_max, '*', 'e', 'retry-scheduled', 'id', ARGV[8], 'ts', ARGV[7]}
  for _, v in ipairs(name_f) do b[#b + 1] = v end
  for _, v in ipairs({'attempt', ARGV[13], 'backoff_ms', ARGV[14]}) do b[#b + 1] = v end
  redis.call(unpack(b))
end
return 1
