-- remove_entries: delete stream entries by id, for Queue.remove and Queue.clean
-- (core/removal.py).  In the job stream only waiting entries go: those past the newest
-- last-delivered-id of its groups (all when it has none); a delivered entry is running, or
-- waiting to be reclaimed, and stays (cancel it instead).  The DLQ has no groups: any entry
-- goes.  The check and the deletes run in one script, so no worker reads an entry this call
-- deletes.
-- KEYS[1] = stream
-- ARGV    = [entry ids...]
-- Reply   = per id, 1 deleted, 0 kept (gone already, or delivered)
--#include delivered
local out = {}
if redis.call('TYPE', KEYS[1])['ok'] ~= 'stream' then
  for i = 1, #ARGV do out[i] = 0 end
  return out
end
local best_ms, best_seq = newest_delivered(KEYS[1])
for i, id in ipairs(ARGV) do
  local ms, seq = parse_id(id)
  local waiting = ms and seq and (ms > best_ms or (ms == best_ms and seq > best_seq))
  out[i] = waiting and redis.call('XDEL', KEYS[1], id) or 0
end
return out
