-- emit_events: append a batch of events to the events stream in one round trip.
-- KEYS[1] = {chasqui:<q>}:events
-- ARGV    = [max_len, count_1, f, v, f, v, ..., count_2, f, v, ...]  (count = number of fields)
-- Reply   = number of events written (events are best effort: include/events.lua)
-- Compact form for one kind of job event, 3 arguments per job (the worker's per-batch
-- `active` events): ARGV = [max_len, 0, kind, ts, id_1, name_1, attempt_1, id_2, ...]
-- writes `e kind id <id> ts <ts> [n <name>] attempt <attempt>` per job (no `n` when name is "").
-- Its XADDs need no argument table, and it trims (MAXLEN ~) once after the batch instead of
-- on every XADD: the same whole nodes go, and each XADD is cheaper.
--#include events
local m = ARGV[1]
local i, n, last = 2, 0, #ARGV
if ARGV[2] == '0' then
  local kind, ts = ARGV[3], ARGV[4]
  for j = 5, last, 3 do
    local written
    if ARGV[j + 1] == '' then
      written = emit(KEYS[1], '*', 'e', kind, 'id', ARGV[j], 'ts', ts, 'attempt', ARGV[j + 2])
    else
      written = emit(KEYS[1], '*', 'e', kind, 'id', ARGV[j], 'ts', ts, 'n', ARGV[j + 1], 'attempt', ARGV[j + 2])
    end
    if written then n = n + 1 end
  end
  if n > 0 then
    redis.call('XTRIM', KEYS[1], 'MAXLEN', '~', m)
  end
  return n
end
while i <= last do
  local c = tonumber(ARGV[i])
  local args = {KEYS[1], 'MAXLEN', '~', m, '*'}
  for j = 1, c * 2 do
    args[#args + 1] = ARGV[i + j]
  end
  if emit(unpack(args)) then n = n + 1 end
  i = i + c * 2 + 1
end
return n
