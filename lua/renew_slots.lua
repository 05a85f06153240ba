-- renew_slots: push the end of this worker's concurrency slots (the running set's members
-- for the entries it holds, see take_starts.lua) one lease past the server's clock, with the
-- entries' own leases.  Only members still present are renewed (ZADD XX): a slot purged after
-- its lease belongs to nobody, or to the worker that reclaimed its entry.
-- KEYS[1] = running set
-- ARGV    = [lease_ms, entry id 1, ...]
-- Reply   = the number of members renewed
if redis.call('TYPE', KEYS[1]).ok ~= 'zset' then
  return 0
end
local t = redis.call('TIME')
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + (tonumber(ARGV[1]) or 0)
local n = 0
for i = 2, #ARGV, 500 do
  local args = {}
  args[1], args[2] = 'XX', 'CH'  -- ZADD's flags (a table literal would read as a command name)
  for j = i, math.min(#ARGV, i + 499) do
    args[#args + 1] = until_ms
    args[#args + 1] = ARGV[j]
  end
  n = n + redis.call('ZADD', KEYS[1], unpack(args))
end
return n
