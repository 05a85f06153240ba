-- fetch_due: the scheduler's read, in one round trip: the due specs with their scores (the
-- fire instants the scheduler will compare-and-set on) and their stored spec and ext fields.
-- KEYS[1] = repeat
-- ARGV    = [now_ms ("" = the server's TIME), limit, key_prefix]   (spec hashes are
--           <key_prefix>:repeat:spec:<key>, in the same hash slot as KEYS[1])
-- Reply   = {next_score|nil, now_ms, key_1, score_1, spec_1, ext_1|nil, key_2, ...}
--           next_score = the earliest score after now when fewer than `limit` were due;
--           spec_i = the stored bytes, nil when the hash has no spec (a dangling entry), or
--           {reason} when the spec key is not a hash: one bad entry never fails the read.
--           (Counters are checked where they are raised: schedule_batch.)
local now = ARGV[1]
if now == '' then
  local t = redis.call('TIME')
  now = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
end
local limit = tonumber(ARGV[2])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
local out = {false, now}
local base = ARGV[3] .. ':repeat:spec:'

for i = 1, #due, 2 do
  local hash = base .. due[i]
  local fields = redis.pcall('HMGET', hash, 'spec', 'ext')
  local spec, ext = false, false
  if fields.err then
    spec = {'the spec key is a ' .. redis.call('TYPE', hash).ok .. ', not a hash'}
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
