-- emit_events: append a batch of events to the events stream in one round trip.
-- KEYS[1] = {chasqui:<q>}:events
-- ARGV    = [max_len, count_1, f, v, f, v, ..., count_2, f, v, ...]  (count = number of fields)
-- Reply   = number of events written
local i, n = 2, 0
while i <= #ARGV do
  local c = tonumber(ARGV[i])
  local args = {'XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*'}
  for j = 1, c * 2 do
    args[#args + 1] = ARGV[i + j]
  end
  redis.call(unpack(args))
  i = i + c * 2 + 1
  n = n + 1
end
return n
