-- promote: move due delayed members into the stream (wire spec 11.1), plus the side-index
-- cleanup and `waiting` events ChasquiMQ's caller does afterwards, in the same round trip.
-- KEYS[1] = delayed   KEYS[2] = stream   KEYS[3] = events
-- ARGV    = [limit, max_stream_len, events_max_len (0 = events off), key_prefix]
-- Reply   = {promoted, depth, oldest_lag_ms, now_ms}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local events_max = tonumber(ARGV[3])
for _, member in ipairs(due) do
  local b1, b2, b3, b4 = string.byte(member, 1, 4)
  local n = b1 + b2 * 256 + b3 * 65536 + b4 * 16777216
  local name = string.sub(member, 5, 4 + n)
  local env = string.sub(member, 5 + n)
  if n == 0 then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'd', env)
  else
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'd', env, 'n', name)
  end
  redis.call('ZREM', KEYS[1], member)
  local ok, decoded = pcall(cmsgpack.unpack, env)
  if ok and type(decoded) == 'table' and type(decoded[1]) == 'string' then
    redis.call('DEL', ARGV[4] .. ':didx:' .. decoded[1])
    if events_max > 0 then
      redis.call('XADD', KEYS[3], 'MAXLEN', '~', events_max, '*', 'e', 'waiting', 'id', decoded[1], 'ts', now)
    end
  end
end
local depth = redis.call('ZCARD', KEYS[1])
local lag = 0
if depth > 0 then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  lag = math.max(0, now - tonumber(first[2]))
end
return {#due, depth, lag, now}
