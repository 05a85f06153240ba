-- obliterate_begin: the atomic first step of Queue.obliterate().  Unless forced, refuses while
-- the queue is in use: a group with pending (running) entries, a consumer that read within the
-- activity window, or a promoter or scheduler lock held (every worker runs a promoter).  Then,
-- in the same call, deletes the queue's fixed keys and moves its indexes aside to fresh keys
-- that purge_index.lua empties (with the per-job keys they list) a chunk at a time.
-- KEYS[1..6]  = stream, dlq, events, promoter lock, scheduler lock, repeat quarantine (deleted)
-- KEYS[7..6+m] = the m indexes moved aside (delayed, results, failures, repeat, repeat paused,
--                prioritized: maintenance.py's _INDEXES)
-- KEYS[7+m..6+2m] = where they go
-- ARGV        = [force (1|0), activity window ms]
-- Reply       = {1, keys deleted} or {0, why it refused}
local function fields(flat)
  local out = {}
  for i = 1, #flat - 1, 2 do out[flat[i]] = flat[i + 1] end
  return out
end
if ARGV[1] ~= '1' then
  for i = 4, 5 do
    local holder = redis.call('GET', KEYS[i])
    if holder then
      return {0, (i == 4 and 'a promoter' or 'a scheduler') .. ' (' .. holder .. ') holds its lock: a worker or '
        .. 'standalone loop is running'}
    end
  end
  if redis.call('TYPE', KEYS[1])['ok'] == 'stream' then
    local window = tonumber(ARGV[2])
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
      local group = fields(g)
      if tonumber(group['pending']) > 0 then
        return {0, 'group ' .. group['name'] .. ' has ' .. group['pending'] .. ' pending (running) jobs'}
      end
      for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], group['name'])) do
        local consumer = fields(c)
        if tonumber(consumer['idle']) < window then
          return {0, 'consumer ' .. consumer['name'] .. ' of group ' .. group['name'] .. ' read '
            .. consumer['idle'] .. ' ms ago'}
        end
      end
    end
  end
end
local n = 0
local m = (#KEYS - 6) / 2
for i = 7, 6 + m do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('RENAME', KEYS[i], KEYS[i + m])
    n = n + 1
  end
end
for i = 1, 6 do
  n = n + redis.call('UNLINK', KEYS[i])
end
return {1, n}
