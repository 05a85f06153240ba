-- take_rate: how many of `want` jobs may start now under the queue's rate limit (issue 24).
-- The limit is `rate_max` jobs per `rate_per_ms` in the controls hash (Queue.set_rate_limit);
-- windows are fixed and aligned to the server's clock (TIME): window w is
-- [w * per_ms, (w + 1) * per_ms), and the grants of all workers together in one window never
-- exceed rate_max.  What a window granted lives in the state hash (w, n), gone a window after.
-- A limit that is not two positive integers (a hostile or foreign value, a key of another
-- type) is no limit; a state hash of another type is replaced.
-- KEYS[1] = controls hash, KEYS[2] = rate state hash
-- ARGV    = [want]
-- Reply   = [granted, wait_ms]  (wait_ms: until the next window, when granted < want; else 0)
local want = tonumber(ARGV[1]) or 0
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
  return {want, 0}
end
local lim = redis.call('HMGET', KEYS[1], 'rate_max', 'rate_per_ms')
local function positive_int(raw)
  if not raw or not string.match(raw, '^[1-9][0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?[0-9]?$') then
    return nil
  end
  return tonumber(raw)
end
local max, per = positive_int(lim[1]), positive_int(lim[2])
if not max or not per then
  return {want, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
local grant = math.min(want, max - used)
if grant < 0 then grant = 0 end
if grant > 0 then
  redis.call('HSET', KEYS[2], 'w', string.format('%d', w), 'n', string.format('%d', used + grant))
  redis.call('PEXPIRE', KEYS[2], per + 1000)
end
local wait = 0
if grant < want then
  wait = (w + 1) * per - now
end
return {grant, wait}
