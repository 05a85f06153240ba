-- take_grouped: move up to `n` jobs of the waiting groups to the stream's tail, round robin: one
-- job of each group in turn, the group then going to the back of the turn (issue 24).  A worker
-- calls it when its group has read everything else in the stream, so a backlog of one group
-- delays another group's next job by at most one turn.  A group is passed over (keeping its
-- turn) while its `RateLimited` block lives, while it runs as many jobs as its concurrency
-- limit, or while its rate window is spent:
--   concurrency: `c:<group>` in the limits hash, else `dc` (every group); each moved job holds a
--     slot in the group's running set (entry id -> end of its lease, server clock), renewed and
--     freed by the worker that reads it, purged one lease after its last renewal;
--   rate: `r:<group>` else `dr`, "max:per_ms", fixed windows on the server clock (as take_starts).
-- Each entry carries its group in the field `g` (ChasquiMQ ignores it).  A member that does not
-- split into name and envelope reaches the stream whole (the workers' gate dead-letters it).
-- Limits that are not positive integers are no limits; keys of another type are replaced, but a
-- stream of another type, or a full one (include/key_types.lua), moves nothing (a popped member
-- must reach the stream).
-- KEYS[1] = groups (zset), KEYS[2] = stream, KEYS[3] = group limits hash
-- ARGV    = [n, max_stream_len, lease_ms, key prefix ({chasqui:<queue>})]
-- Reply   = the number of jobs moved
--#include key_types
if redis.call('TYPE', KEYS[1]).ok ~= 'zset' then
  return 0
end
local st = redis.call('TYPE', KEYS[2]).ok
if (st ~= 'stream' and st ~= 'none') or (st == 'stream' and stream_full(KEYS[2])) then
  return 0
end
local n, maxlen, lease, prefix = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]) or 0, ARGV[4]
local limits = redis.call('TYPE', KEYS[3]).ok == 'hash'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local POSITIVE = '^[1-9][0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?$'

local function limit_of(field, group)
  if not limits then return nil end
  return redis.call('HGET', KEYS[3], field .. ':' .. group) or redis.call('HGET', KEYS[3], 'd' .. field)
end
local function concurrency_of(group)
  local raw = limit_of('c', group)
  return raw and string.match(raw, POSITIVE) and tonumber(raw)
end
local function rate_of(group)
  local raw = limit_of('r', group)
  if not raw then return nil end
  local max, per = string.match(raw, '^([0-9]+):([0-9]+)$')
  if not max or not string.match(max, POSITIVE) or not string.match(per, POSITIVE) then return nil end
  return tonumber(max), tonumber(per)
end
local function typed(key, want)
  local kind = redis.call('TYPE', key).ok
  if kind ~= want and kind ~= 'none' then redis.call('DEL', key) end
end

-- whether `group` may start one more job now; its running set and rate state when it may
local function admit(group)
  if redis.call('EXISTS', prefix .. ':gblocked:' .. group) == 1 then return false end
  local conc = concurrency_of(group)
  local run
  if conc then
    run = prefix .. ':grun:' .. group
    typed(run, 'zset')
    while true do  -- the slots of workers that died: past their lease
      local gone = redis.call('ZRANGEBYSCORE', run, '-inf', now, 'LIMIT', 0, 1000)
      if #gone == 0 then break end
      redis.call('ZREM', run, unpack(gone))
    end
    if redis.call('ZCARD', run) >= conc then return false end
  end
  local max, per = rate_of(group)
  local rate
  if max then
    rate = prefix .. ':grate:' .. group
    typed(rate, 'hash')
    local st = redis.call('HMGET', rate, 'w', 'n')
    local w = math.floor(now / per)
    local used = (tonumber(st[1]) == w) and (tonumber(st[2]) or 0) or 0
    if used >= max then return false end
    redis.call('HSET', rate, 'w', string.format('%d', w), 'n', string.format('%d', used + 1))
    redis.call('PEXPIRE', rate, per + 1000)
  end
  return true, run
end

local moved = 0
while moved < n do
  local turn = redis.call('ZRANGE', KEYS[1], 0, 199)
  if #turn == 0 then break end
  local progress = false
  for _, group in ipairs(turn) do
    if moved >= n then break end
    local list = prefix .. ':group:' .. group
    if redis.call('TYPE', list).ok ~= 'list' then  -- emptied (or not a list): out of the turn
      typed(list, 'list')
      redis.call('ZREM', KEYS[1], group)
    else
      local ok, run = admit(group)
      if ok then
        local member = redis.call('LPOP', list)
        local b1, b2, b3, b4 = string.byte(member, 1, 4)
        local len = b4 and (b1 + b2 * 256 + b3 * 65536 + b4 * 16777216)
        local id
        if not len or 4 + len > #member then
          id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'd', member, 'g', group)
        elseif len == 0 then
          id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'd', string.sub(member, 5), 'g', group)
        else
          id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'd', string.sub(member, 5 + len),
            'n', string.sub(member, 5, 4 + len), 'g', group)
        end
        if run then  -- gone with its last member (the worker's ZREM, or a purge here)
          redis.call('ZADD', run, now + lease, id)
        end
        moved = moved + 1
        progress = true
        if redis.call('LLEN', list) == 0 then
          redis.call('ZREM', KEYS[1], group)
        else
          local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
          redis.call('ZADD', KEYS[1], (tonumber(last[2]) or 0) + 1, group)
        end
      end
    end
  end
  if not progress then break end
end
return moved
