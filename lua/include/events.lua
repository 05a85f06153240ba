-- events: `emit(...)` writes one event (`XADD` with these arguments) as best effort, as the wire
-- asks: an events stream that refuses it (full: its last id is the largest, see key_types.lua;
-- or any other error) turns this call's remaining events off instead of failing the script
-- after its acks or moves, which would make every retry of the call run the jobs again.
-- Returns whether the event was written.
local events_open = true
local function emit(...)
  if not events_open then
    return false
  end
  local r = redis.pcall('XADD', ...)
  if type(r) == 'table' and r.err then
    events_open = false
    return false
  end
  return true
end
