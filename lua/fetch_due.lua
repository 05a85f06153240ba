-- fetch_due: the scheduler's read, in one round trip: the due specs with their scores (the
-- fire instants the scheduler will compare-and-set on) and their stored spec and ext fields.
-- KEYS[1] = repeat
-- ARGV    = [now_ms, limit, key_prefix]   (spec hashes are <key_prefix>:repeat:spec:<key>,
--           in the same hash slot as KEYS[1])
-- Reply   = {next_score|nil, key_1, score_1, spec_1|nil, ext_1|nil, key_2, ...}
--           next_score = the earliest score after now when fewer than `limit` were due
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local out = {false}
local base = ARGV[3] .. ':repeat:spec:'
for i = 1, #due, 2 do
  local fields = redis.call('HMGET', base .. due[i], 'spec', 'ext')
  out[2 * i] = due[i]
  out[2 * i + 1] = due[i + 1]
  out[2 * i + 2] = fields[1]
  out[2 * i + 3] = fields[2]
end
if #due < 2 * tonumber(ARGV[2]) then
  local nxt = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if nxt[2] then
    out[1] = nxt[2]
  end
end
return out
