-- drain_stream: delete up to a chunk of waiting entries, never a delivered one.  Waiting
-- entries are those past the newest last-delivered-id of the stream's groups (all of them when
-- there is no group); entries at or below it were delivered and are pending (running, or
-- waiting to be reclaimed after a crash) or, being acked, already deleted: they are kept.  The
-- check and the deletes run in one script, so no worker can read an entry this call deletes.
-- KEYS[1] = stream
-- ARGV    = [top (the newest id drain_begin saw), chunk]
-- Reply   = {entries deleted, 1 when a full chunk was deleted (call again) else 0}
if ARGV[1] == '' or redis.call('TYPE', KEYS[1])['ok'] ~= 'stream' then
  return {0, 0}
end
local floor, best_ms, best_seq = '-', -1, -1
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  for i = 1, #g - 1, 2 do
    if g[i] == 'last-delivered-id' then
      local id = g[i + 1]
      local p = string.find(id, '-', 1, true)
      local ms, seq = tonumber(string.sub(id, 1, p - 1)), tonumber(string.sub(id, p + 1))
      if ms > best_ms or (ms == best_ms and seq > best_seq) then
        best_ms, best_seq, floor = ms, seq, '(' .. id
      end
    end
  end
end
local chunk = tonumber(ARGV[2])
local rows = redis.call('XRANGE', KEYS[1], floor, ARGV[1], 'COUNT', chunk)
local ids = {}
for i, row in ipairs(rows) do ids[i] = row[1] end
for i = 1, #ids, 500 do
  redis.call('XDEL', KEYS[1], unpack(ids, i, math.min(i + 499, #ids)))
end
return {#ids, #ids == chunk and 1 or 0}
