-- take_starts: how many of the candidate jobs may start now under the queue's concurrency
-- limit and rate limit together (issue 24).  One script, so a job that has no slot takes no
-- rate grant and one that the rate refuses takes no slot.
--
-- Concurrency (`concurrency` in the controls hash, Queue.set_concurrency): the running set
-- holds one member per started entry (its stream entry id), scored with its lease's end on the
-- server's clock (TIME); the worker renews it with the entry's lease (renew_slots.lua) and
-- removes it when the entry settles.  A member past its end (a worker that died) is purged
-- here, so a dead worker's slot comes back one lease after its last renewal.  A candidate that
-- is already a member (an entry reclaimed from a dead worker, a job held back and offered
-- again) keeps its slot and costs no new one.
--
-- Rate (`rate_max` jobs per `rate_per_ms`, Queue.set_rate_limit): windows are fixed and
-- aligned to the server's clock: window w is [w * per_ms, (w + 1) * per_ms), and the grants of
-- all workers together in one window never exceed rate_max.  What a window granted lives in the
-- state hash (w, n), gone a window after.
--
-- The grant is a prefix of the candidates (FIFO).  A limit that is not a positive integer (a
-- hostile or foreign value, a key of another type) is no limit; a state key of another type is
-- replaced.
-- KEYS[1] = controls hash, KEYS[2] = rate state hash, KEYS[3] = running set (sorted set)
-- ARGV    = [want, lease_ms, entry id 1, ..., entry id want]
-- Reply   = [granted, wait_ms, slotted, now_ms]  (wait_ms: until the next rate window when the
--            rate limit held jobs back, else 0: a job without a slot waits for one to be freed;
--            slotted: 1 when the granted jobs hold slots, to be freed when they settle;
--            now_ms: the server's clock the grant was made at, 0 when no limit applied)
local want = tonumber(ARGV[1]) or 0
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
  return {want, 0, 0, 0}
end
local lim = redis.call('HMGET', KEYS[1], 'rate_max', 'rate_per_ms', 'concurrency')
local function positive_int(raw)
  if not raw or not string.match(raw, '^[1-9][0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?$') then
    return nil
  end
  return tonumber(raw)
end
local max, per, conc = positive_int(lim[1]), positive_int(lim[2]), positive_int(lim[3])
if not conc and (not max or not per) then
  return {want, 0, 0, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local grant = want
local lease = tonumber(ARGV[2]) or 0
if conc then
  local kind = redis.call('TYPE', KEYS[3]).ok
  if kind ~= 'zset' and kind ~= 'none' then
    redis.call('DEL', KEYS[3])
  end
  while true do  -- the slots of workers that died: past their lease
    local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 1000)
    if #gone == 0 then break end
    redis.call('ZREM', KEYS[3], unpack(gone))
  end
  local running = redis.call('ZCARD', KEYS[3])
  local g = 0
  for i = 1, want do
    if redis.call('ZSCORE', KEYS[3], ARGV[2 + i]) then
      g = g + 1
    elseif running < conc then
      running = running + 1
      g = g + 1
    else
      break
    end
  end
  grant = g
end
local wait = 0
if max and per then
  local w = math.floor(now / per)
  local kind = redis.call('TYPE', KEYS[2]).ok
  if kind ~= 'hash' and kind ~= 'none' then
    redis.call('DEL', KEYS[2])
  end
  local used = 0
  local st = redis.call('HMGET', KEYS[2], 'w', 'n')
  if tonumber(st[1]) == w then
    used = tonumber(st[2]) or 0
    if used ~= used or used < 0 then used = 0 end
  end
  local left = max - used
  if left < 0 then left = 0 end
  if left < grant then
    grant = left
    wait = (w + 1) * per - now
  end
  if grant > 0 then
    redis.call('HSET', KEYS[2], 'w', string.format('%d', w), 'n', string.format('%d', used + grant))
    redis.call('PEXPIRE', KEYS[2], per + 1000)
  end
end
if conc and grant > 0 then
  local until_ms = now + lease
  for i = 1, grant, 500 do
    local args = {}
    for j = i, math.min(grant, i + 499) do
      args[#args + 1] = until_ms
      args[#args + 1] = ARGV[2 + j]
    end
    redis.call('ZADD', KEYS[3], unpack(args))
  end
end
return {grant, wait, conc and 1 or 0, now}
