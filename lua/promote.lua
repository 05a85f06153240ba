-- promote: move due delayed members into the stream (wire spec 11.1), plus the side-index
-- cleanup and `waiting` events ChasquiMQ's caller does afterwards, in the same round trip.
-- KEYS[1] = delayed   KEYS[2] = stream   KEYS[3] = events   KEYS[4] = dlq
-- ARGV    = [limit, max_stream_len, events_max_len (0 = events off), key_prefix, dlq_max_len]
-- Reply   = {moved (promoted + dead-lettered), depth, oldest_lag_ms, now_ms}
-- A member shorter than its 4-byte name prefix, or whose prefix runs past its end, has no
-- envelope to promote: it goes to the DLQ whole (`d` = every byte of the member, reason
-- decode_failed, a detail saying why) instead of failing the script, which would stall every
-- due member for ever.  A stream of another type is an error before any write (a member
-- written to the stream and not removed would be promoted again at every tick), and so is a
-- full stream (include/key_types.lua); with a DLQ of another type, or full, the members that
-- would go there stay in the delayed set and the others are promoted; an events key of another
-- type turns the events off, and a full one the rest of this call's events (include/events.lua).
-- The envelope's id, read by hand: Redis' cmsgpack cannot decode the bin payload that follows
-- it, so unpacking the whole envelope fails.  Envelope = array header (fixarray, array16,
-- array32) then the id as fixstr/str8/str16/str32.  Returns nil for anything else.
local function envelope_id(env)
  local a = string.byte(env, 1)
  local pos
  if a and a >= 0x90 and a <= 0x9f then pos = 2
  elseif a == 0xdc then pos = 4
  elseif a == 0xdd then pos = 6
  else return nil end
  local t = string.byte(env, pos)
  local len, start
  if not t then return nil
  elseif t >= 0xa0 and t <= 0xbf then len, start = t - 0xa0, pos + 1
  elseif t == 0xd9 then len, start = string.byte(env, pos + 1), pos + 2
  elseif t == 0xda then
    local b1, b2 = string.byte(env, pos + 1, pos + 2)
    if b2 then len, start = b1 * 256 + b2, pos + 3 end
  elseif t == 0xdb then
    local b1, b2, b3, b4 = string.byte(env, pos + 1, pos + 4)
    if b4 then len, start = ((b1 * 256 + b2) * 256 + b3) * 256 + b4, pos + 5 end
  end
  if not len or start + len - 1 > #env then return nil end
  return string.sub(env, start, start + len - 1)
end

--#include key_types
--#include events
local refused = wrong_type('promote', {KEYS[2], 'stream+'})
if refused then
  return refused
end
-- a DLQ of another type: the members that would go there stay in the delayed set (the others
-- are promoted; before, a spoiled DLQ stopped every promotion)
local dlq_type = redis.call('TYPE', KEYS[4]).ok
local dlq_ok = dlq_type == 'stream' or dlq_type == 'none'
local dlq_checked = dlq_type ~= 'stream'  -- whether a full DLQ was ruled out (only when needed)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local events_max = events_max_for(KEYS[3], tonumber(ARGV[3]))
-- The ZREMs, the side-index DELs and the events' MAXLEN ~ trim are done once per batch after
-- the loop (in chunks of 500 arguments), not per member: the same effects inside this atomic
-- script, at a fraction of the per-call cost.
local didx, waiting, moved = {}, 0, {}
for _, member in ipairs(due) do
  local b1, b2, b3, b4 = string.byte(member, 1, 4)
  local n = b4 and (b1 + b2 * 256 + b3 * 65536 + b4 * 16777216)
  local env
  if not n or 4 + n > #member then
    if not dlq_checked then
      dlq_checked = true
      dlq_ok = not stream_full(KEYS[4])
    end
    if dlq_ok then
      local why = n and ('name length ' .. n .. ' runs past the member (' .. #member .. ' bytes)')
        or ('member of ' .. #member .. ' bytes is shorter than its 4-byte name prefix')
      redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'd', member, 'source_id', '',
        'reason', 'decode_failed', 'detail', 'delayed member: ' .. why)
    else
      member = nil  -- stays where it is
    end
  elseif n == 0 then
    env = string.sub(member, 5)
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'd', env)
  else
    env = string.sub(member, 5 + n)
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'd', env, 'n', string.sub(member, 5, 4 + n))
  end
  if member then moved[#moved + 1] = member end
  local id = env and envelope_id(env)
  if id then
    didx[#didx + 1] = ARGV[4] .. ':didx:' .. id
    if events_max > 0 then
      emit(KEYS[3], '*', 'e', 'waiting', 'id', id, 'ts', now)
      waiting = waiting + 1
    end
  end
end
for i = 1, #moved, 500 do
  redis.call('ZREM', KEYS[1], unpack(moved, i, math.min(i + 499, #moved)))
end
for i = 1, #didx, 500 do
  redis.call('DEL', unpack(didx, i, math.min(i + 499, #didx)))
end
if waiting > 0 then
  redis.call('XTRIM', KEYS[3], 'MAXLEN', '~', events_max)
end
local depth = redis.call('ZCARD', KEYS[1])
local lag = 0
if depth > 0 then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  lag = math.max(0, now - tonumber(first[2]))
end
return {#moved, depth, lag, now}
