-- job_counts: a queue's job counts in one script, so they are one instant's: a job moving
-- between keys meanwhile (a retry from the stream to the delayed set, a promotion back) is
-- counted once, never missed or counted twice (core/counts.py: Queue.get_job_counts and the
-- read model every viewer shares).  Reads only.  A key of another type (hostile) counts as empty.
-- KEYS = [stream, delayed set, DLQ stream, prioritized set, controls hash]
-- ARGV = [consumer group]
-- Reply = [stream length, waiting, active, delayed, failed, prioritized, the controls' `paused`
--          value or '']
--   waiting: entries the group has not read (every entry when the group does not exist); -1
--   when Redis cannot tell (the group's lag is unknown, after deletes inside the range it has
--   not read, and entries follow its last read one)
local function is(key, want)
  return redis.call('TYPE', key).ok == want
end
local len, waiting, active = 0, 0, 0
if is(KEYS[1], 'stream') then
  len = redis.call('XLEN', KEYS[1])
  waiting = len
  for _, row in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local g = {}
    for j = 1, #row - 1, 2 do g[row[j]] = row[j + 1] end
    if g['name'] == ARGV[1] then
      active = tonumber(g['pending']) or 0
      if g['lag'] then
        waiting = tonumber(g['lag']) or 0
      else
        local next = redis.pcall('XRANGE', KEYS[1], '(' .. tostring(g['last-delivered-id']), '+', 'COUNT', 1)
        if type(next) ~= 'table' or next.err or #next == 0 then
          waiting = 0
        else
          waiting = -1
        end
      end
      break
    end
  end
end
local paused = ''
if is(KEYS[5], 'hash') then paused = redis.call('HGET', KEYS[5], 'paused') or '' end
local delayed, failed, prioritized = 0, 0, 0
if is(KEYS[2], 'zset') then delayed = redis.call('ZCARD', KEYS[2]) end
if is(KEYS[3], 'stream') then failed = redis.call('XLEN', KEYS[3]) end
if is(KEYS[4], 'zset') then prioritized = redis.call('ZCARD', KEYS[4]) end
return {len, waiting, active, delayed, failed, prioritized, paused}
