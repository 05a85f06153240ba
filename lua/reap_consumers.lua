-- reap_consumers: remove consumers of a group that hold no pending entry and have been idle
-- at least min_idle_ms (a worker's own consumer at shutdown: min_idle_ms 0 and its name).
-- The pending check and XGROUP DELCONSUMER run atomically, so no entry is ever dropped.
-- KEYS[1] = stream
-- ARGV    = [group, min_idle_ms, name ('' = every consumer of the group)]
-- Reply   = the names removed
local stream, group, min_idle, only = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3]
local removed = {}
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', stream, group)) do
  local f = {}
  for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
  if (only == '' or f['name'] == only) and tonumber(f['pending']) == 0 and tonumber(f['idle']) >= min_idle then
    redis.call('XGROUP', 'DELCONSUMER', stream, group, f['name'])
    removed[#removed + 1] = f['name']
  end
end
return removed
