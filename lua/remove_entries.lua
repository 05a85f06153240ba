-- remove_entries: delete stream entries by id, for Queue.remove and Queue.clean
-- (core/removal.py).  In the job stream only waiting entries go: those past the newest
-- last-delivered-id of its groups (all when it has none); a delivered entry is running, or
-- waiting to be reclaimed, and stays (cancel it instead).  The DLQ has no groups: any entry
-- goes.  The check and the deletes run in one script, so no worker reads an entry this call
-- deletes.
-- KEYS[1] = stream
-- ARGV    = [entry ids...]
-- Reply   = per id, 1 deleted, 0 kept (gone already, or delivered)
local out = {}
if redis.call('TYPE', KEYS[1])['ok'] ~= 'stream' then
  for i = 1, #ARGV do out[i] = 0 end
  return out
end
local function parse(id)
  local p = string.find(id, '-', 1, true)
  if not p then return nil end
  return tonumber(string.sub(id, 1, p - 1)), tonumber(string.sub(id, p + 1))
end
local best_ms, best_seq = -1, -1
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  for i = 1, #g - 1, 2 do
    if g[i] == 'last-delivered-id' then
      local ms, seq = parse(g[i + 1])
      if ms and seq and (ms > best_ms or (ms == best_ms and seq > best_seq)) then
        best_ms, best_seq = ms, seq
      end
    end
  end
end
for i, id in ipairs(ARGV) do
  local ms, seq = parse(id)
  local waiting = ms and seq and (ms > best_ms or (ms == best_ms and seq > best_seq))
  out[i] = waiting and redis.call('XDEL', KEYS[1], id) or 0
end
return out
