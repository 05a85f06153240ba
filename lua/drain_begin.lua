-- drain_begin: the atomic first step of Queue.drain().  Notes the stream's newest entry (the
-- drain deletes waiting entries up to it, so jobs added after the drain began survive) and
-- moves the delayed ZSET aside to a fresh key that drain's later calls empty a chunk at a time
-- (purge_index.lua): delayed adds, promotions and retries that come after this call go to a
-- new, empty delayed ZSET and are kept.
-- The prioritized set (jobs added with a priority, waiting to enter the stream) is waiting
-- work too: it always moves aside, to KEYS[5], and is emptied the same way.
-- KEYS[1] = stream   KEYS[2] = delayed   KEYS[3] = a fresh key of the queue's hash tag
-- KEYS[4] = prioritized   KEYS[5] = another fresh key
-- KEYS[6] = the job groups' turn   KEYS[7] = a third fresh key (drain_groups.lua empties the
--           groups it lists; a job added to one of them before its chunk goes with it)
-- ARGV    = [with_delayed (1|0)]
-- Reply   = {newest stream entry id ('' when there is none), delayed members moved aside,
--            prioritized members moved aside, groups moved aside}
local top = ''
if redis.call('TYPE', KEYS[1])['ok'] == 'stream' then
  local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
  if last then top = last[1] end
end
local moved = 0
if ARGV[1] == '1' and redis.call('TYPE', KEYS[2])['ok'] == 'zset' then
  moved = redis.call('ZCARD', KEYS[2])
  redis.call('RENAME', KEYS[2], KEYS[3])
end
local prioritized = 0
if redis.call('TYPE', KEYS[4])['ok'] == 'zset' then
  prioritized = redis.call('ZCARD', KEYS[4])
  redis.call('RENAME', KEYS[4], KEYS[5])
end
local groups = 0
if redis.call('TYPE', KEYS[6])['ok'] == 'zset' then
  groups = redis.call('ZCARD', KEYS[6])
  redis.call('RENAME', KEYS[6], KEYS[7])
end
return {top, moved, prioritized, groups}
