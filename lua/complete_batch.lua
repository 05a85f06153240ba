-- complete_batch: ack a batch of finished jobs and record their outcome in one round trip:
-- XACK + XDEL (or XACKDEL on Redis 8.2+), `completed` events, opt-in result keys.
-- KEYS[1] = stream   KEYS[2] = events
-- ARGV    = [group, use_xackdel (0|1), events_max_len (0 = off), result_ttl_ms (0 = no results),
--            key_prefix, now_ms, then 6 per job: entry_id, job_id, name, attempt, duration_us, result]
--           (result "" = nothing to store)
-- Reply   = number of entries acknowledged
local group, xackdel = ARGV[1], ARGV[2] == '1'
local events_max, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local prefix, now = ARGV[5], ARGV[6]
local acked = 0
-- Without XACKDEL the acked entries are deleted with one XDEL per 500 at the end: on Redis 7.0
-- a lone XDEL of the stream's first entry rescans for the new first id, so deleting entry by
-- entry costs several times more than the whole rest of this script.
local to_delete = {}
for i = 7, #ARGV, 6 do
  local eid = ARGV[i]
  local ok
  if xackdel then
    local r = redis.call('XACKDEL', KEYS[1], group, 'IDS', 1, eid)
    ok = tonumber(r[1]) == 1 or tonumber(r[1]) == 2
  else
    ok = redis.call('XACK', KEYS[1], group, eid) == 1
    if ok then to_delete[#to_delete + 1] = eid end
  end
  if ok then
    acked = acked + 1
    local id, name = ARGV[i + 1], ARGV[i + 2]
    if ttl > 0 and ARGV[i + 5] ~= '' then
      redis.call('SET', prefix .. ':result:' .. id, ARGV[i + 5], 'PX', ttl)
    end
    if events_max > 0 then
      if name == '' then
        redis.call('XADD', KEYS[2], 'MAXLEN', '~', events_max, '*', 'e', 'completed', 'id', id, 'ts', now,
          'attempt', ARGV[i + 3], 'duration_us', ARGV[i + 4])
      else
        redis.call('XADD', KEYS[2], 'MAXLEN', '~', events_max, '*', 'e', 'completed', 'id', id, 'ts', now,
          'n', name, 'attempt', ARGV[i + 3], 'duration_us', ARGV[i + 4])
      end
    end
  end
end
for j = 1, #to_delete, 500 do
  redis.call('XDEL', KEYS[1], unpack(to_delete, j, math.min(j + 499, #to_delete)))
end
return acked
