-- purge_index: empty, a chunk per call, a ZSET that drain_begin or obliterate_begin moved
-- aside, with the per-job keys its members name (all under the queue's hash tag).
-- KEYS[1] = the ZSET moved aside
-- ARGV    = [chunk, key_prefix, mode]
--           mode 'delayed': members are delayed members (u32le name length, name, envelope):
--             the delayed-id index and the idempotency marker of their job go too, as in
--             cancel_delayed.lua;
--           mode ':<suffix>': members are ids; <prefix><suffix><member> is deleted with them
--             (':result:', ':failure:', ':repeat:spec:').
-- Reply   = members removed (0 when the ZSET is empty or gone)
-- The envelope's id, read by hand as in promote.lua (cmsgpack cannot decode the bin payload).
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

if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' then
  return 0
end
local prefix, mode = ARGV[2], ARGV[3]
local popped = redis.call('ZPOPMIN', KEYS[1], tonumber(ARGV[1]))
local doomed = {}
for i = 1, #popped, 2 do
  local member = popped[i]
  if mode == 'delayed' then
    local b1, b2, b3, b4 = string.byte(member, 1, 4)
    local n = b4 and (b1 + b2 * 256 + b3 * 65536 + b4 * 16777216)
    local id = n and 4 + n <= #member and envelope_id(string.sub(member, 5 + n))
    if id then
      doomed[#doomed + 1] = prefix .. ':didx:' .. id
      doomed[#doomed + 1] = prefix .. ':dlid:' .. id
    end
  else
    doomed[#doomed + 1] = prefix .. mode .. member
  end
end
for i = 1, #doomed, 500 do
  redis.call('DEL', unpack(doomed, i, math.min(i + 499, #doomed)))
end
return #popped / 2
