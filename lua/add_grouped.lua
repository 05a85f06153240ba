-- add_grouped: jobs of a group (a tenant) wait in their group's list, and the group joins the
-- round robin of groups with waiting jobs at the back (issue 24; take_grouped.lua serves it).
-- The controls hash gets `grouped` = 1, which tells the workers to look at the groups.  Keys of
-- another type (hostile, foreign) are replaced.
-- KEYS[1] = controls hash, KEYS[2] = groups (zset: group -> turn)
-- ARGV    = [key prefix ({chasqui:<queue>}), n, then per job: group, member (u32le name
--            length + name + envelope)]
-- Reply   = the number of jobs added
for j, want in ipairs({'hash', 'zset'}) do
  local kind = redis.call('TYPE', KEYS[j]).ok
  if kind ~= want and kind ~= 'none' then
    redis.call('DEL', KEYS[j])
  end
end
local prefix, n = ARGV[1], tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'grouped', '1')
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local turn = (tonumber(last[2]) or 0) + 1
for i = 1, n do
  local group, member = ARGV[1 + 2 * i], ARGV[2 + 2 * i]
  local list = prefix .. ':group:' .. group
  local kind = redis.call('TYPE', list).ok
  if kind ~= 'list' and kind ~= 'none' then
    redis.call('DEL', list)
  end
  redis.call('RPUSH', list, member)
  if redis.call('ZADD', KEYS[2], 'NX', turn, group) == 1 then
    turn = turn + 1
  end
end
return n
