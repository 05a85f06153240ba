-- drain_stream: delete up to a chunk of waiting entries, never a delivered one.  Waiting
-- entries are those past the newest last-delivered-id of the stream's groups (all of them when
-- there is no group); entries at or below it were delivered and are pending (running, or
-- waiting to be reclaimed after a crash) or, being acked, already deleted: they are kept.  The
-- check and the deletes run in one script, so no worker can read an entry this call deletes.
-- KEYS[1] = stream
-- ARGV    = [top (the newest id drain_begin saw), chunk]
-- Reply   = {entries deleted, 1 when a full chunk was deleted (call again) else 0}
--#include delivered
if ARGV[1] == '' or redis.call('TYPE', KEYS[1])['ok'] ~= 'stream' then
  return {0, 0}
end
local _, _, delivered = newest_delivered(KEYS[1])
local floor = delivered and '(' .. delivered or '-'
local chunk = tonumber(ARGV[2])
local rows = redis.call('XRANGE', KEYS[1], floor, ARGV[1], 'COUNT', chunk)
local ids = {}
for i, row in ipairs(rows) do ids[i] = row[1] end
for i = 1, #ids, 500 do
  redis.call('XDEL', KEYS[1], unpack(ids, i, math.min(i + 499, #ids)))
end
return {#ids, #ids == chunk and 1 or 0}
