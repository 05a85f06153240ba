-- fetch_due: the scheduler's read, in one round trip: the due specs with their scores (the
-- fire instants the scheduler will compare-and-set on) and their stored spec and ext fields.
-- KEYS[1] = repeat
-- ARGV    = [now_ms ("" = the server's TIME), limit, key_prefix]   (spec hashes are
--           <key_prefix>:repeat:spec:<key>, in the same hash slot as KEYS[1])
-- Reply   = {next_score|nil, now_ms, key_1, score_1, spec_1, ext_1|nil, key_2, ...}
--           next_score = the earliest score after now when fewer than `limit` were due;
--           spec_i = the stored bytes, nil when the hash has no spec (a dangling entry), or
--           {reason} when the entry is corrupt: the key is not a hash, or its `fired` or
--           `skipped` counter is no integer HINCRBY can raise.  One bad entry never fails the read.
local now = ARGV[1]
if now == '' then
  local t = redis.call('TIME')
  now = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
end
local limit = tonumber(ARGV[2])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
local out = {false, now}
local base = ARGV[3] .. ':repeat:spec:'

-- a counter HINCRBY accepts and cannot overflow: nil, or a canonical integer of < 19 digits
local function counter_ok(v)
  return not v or (#v < 19 and (string.match(v, '^-?[1-9]%d*$') ~= nil or v == '0'))
end

for i = 1, #due, 2 do
  local hash = base .. due[i]
  local fields = redis.pcall('HMGET', hash, 'spec', 'ext', 'fired', 'skipped')
  local spec, ext = false, false
  if fields.err then
    spec = {'the spec key is a ' .. redis.call('TYPE', hash).ok .. ', not a hash'}
  elseif not counter_ok(fields[3]) then
    spec = {'the fired counter is not an integer: ' .. string.sub(fields[3], 1, 40)}
  elseif not counter_ok(fields[4]) then
    spec = {'the skipped counter is not an integer: ' .. string.sub(fields[4], 1, 40)}
  else
    spec, ext = fields[1], fields[2]
  end
  out[2 * i + 1] = due[i]
  out[2 * i + 2] = due[i + 1]
  out[2 * i + 3] = spec
  out[2 * i + 4] = ext
end
if #due < 2 * limit then
  local nxt = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if nxt[2] then
    out[1] = nxt[2]
  end
end
return out
