-- reap_consumers: remove consumers of a group that hold no pending entry and have been idle
-- at least min_idle_ms (a worker's own consumer at shutdown: min_idle_ms 0 and its name).
-- The pending check and XGROUP DELCONSUMER run atomically, so no entry is ever dropped.
-- A consumer whose worker beats (KEYS[2], core/liveness.py: scored with the time until which it
-- counts as alive) is alive whatever `idle` says (before Redis 7.2 `idle` counts from the last
-- successful read, so an idle healthy worker looks dead): it is never removed by the sweep.  The
-- beats of workers dead for min_idle_ms are dropped here too.
-- KEYS[1] = stream   KEYS[2] = beats (zset)
-- ARGV    = [group, min_idle_ms, name ('' = every consumer of the group that does not beat)]
-- Reply   = the names removed
local stream, group, min_idle, only = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local beats = redis.call('TYPE', KEYS[2])['ok'] == 'zset'
local removed = {}
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', stream, group)) do
  local f = {}
  for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
  local alive = false
  if only == '' and beats then
    local until_ms = tonumber(redis.call('ZSCORE', KEYS[2], f['name']))
    alive = until_ms ~= nil and until_ms > now
  end
  if (only == '' or f['name'] == only) and not alive and tonumber(f['pending']) == 0
      and tonumber(f['idle']) >= min_idle then
    redis.call('XGROUP', 'DELCONSUMER', stream, group, f['name'])
    removed[#removed + 1] = f['name']
  end
end
if only == '' and beats then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (now - min_idle))
end
return removed
