-- cancel_jobs: jobs that end cancelled (issue 25, core/running.py).  Per job: its stream entry
-- is acknowledged and deleted when one is given (only if still pending: a repeat, or an entry
-- another consumer settled, writes nothing), then the job gets its `cancelled` marker (what
-- get_job_state reads), a `cancelled` event, and its cancel request is removed.  A job given
-- without an entry (taken out of the delayed set by the caller) gets the same, unconditionally.
-- KEYS[1] = stream   KEYS[2] = events   KEYS[3] = cancel requests (hash)
-- ARGV    = [group, use_xackdel (0|1), events_max_len (0 = off), key_prefix, marker_ttl_ms, now_ms,
--            then 3 per job: entry_id, job_id, name]   (entry_id '' = no entry: a delayed job)
-- Reply   = per job, 1 ended cancelled here, 0 its entry was no longer pending (nothing written)
--#include events
local group, xackdel = ARGV[1], ARGV[2] == '1'
local events_max, prefix, ttl, now = tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]
local function type_of(key) return redis.call('TYPE', key)['ok'] end
local et, rt = type_of(KEYS[2]), type_of(KEYS[3])
if et ~= 'stream' and et ~= 'none' then events_max = 0 end
local requests_ok = rt == 'hash' or rt == 'none'
local out = {}
for i = 7, #ARGV, 3 do
  local eid, id, name = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local ok = true
  if eid ~= '' then
    if xackdel then
      local r = redis.call('XACKDEL', KEYS[1], group, 'IDS', 1, eid)
      ok = tonumber(r[1]) == 1 or tonumber(r[1]) == 2
    else
      ok = redis.call('XACK', KEYS[1], group, eid) == 1
      if ok then redis.call('XDEL', KEYS[1], eid) end
    end
  end
  out[#out + 1] = ok and 1 or 0
  if ok then
    redis.call('SET', prefix .. ':cancelled:' .. id, now, 'PX', ttl)
    if requests_ok then redis.call('HDEL', KEYS[3], id) end
    if events_max > 0 then
      if name == '' then
        emit(KEYS[2], 'MAXLEN', '~', events_max, '*', 'e', 'cancelled', 'id', id, 'ts', now)
      else
        emit(KEYS[2], 'MAXLEN', '~', events_max, '*', 'e', 'cancelled', 'id', id, 'ts', now, 'n', name)
      end
    end
  end
end
return out
