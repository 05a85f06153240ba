-- drain_groups: one chunk of Queue.drain()'s job groups: pop up to `chunk` groups from the turn
-- moved aside by drain_begin and delete their waiting jobs (each group's list).
-- KEYS[1] = the groups' turn, moved aside
-- ARGV    = [chunk, key prefix ({chasqui:<queue>})]
-- Reply   = {groups popped, jobs deleted}
if redis.call('TYPE', KEYS[1]).ok ~= 'zset' then
  return {0, 0}
end
local popped = redis.call('ZPOPMIN', KEYS[1], tonumber(ARGV[1]))
local jobs = 0
for i = 1, #popped, 2 do
  local list = ARGV[2] .. ':group:' .. popped[i]
  if redis.call('TYPE', list).ok == 'list' then
    jobs = jobs + redis.call('LLEN', list)
  end
  redis.call('DEL', list)
end
return {#popped / 2, jobs}
