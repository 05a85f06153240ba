-- acks: what the scripts that settle a batch of entries share (complete_batch, fail_batch;
-- `--#include acks`).
--
-- xackdel_codes(stream, group, ids): XACKDEL (Redis 8.2+) of every id, one call per 500 (it
-- takes many ids and answers per id); the codes in the ids' order (1 or 2: acked here).
local function xackdel_codes(stream, group, ids)
  local codes = {}
  for j = 1, #ids, 500 do
    local hi = math.min(j + 499, #ids)
    local r = redis.call('XACKDEL', stream, group, 'IDS', hi - j + 1, unpack(ids, j, hi))
    for k = 1, #r do codes[#codes + 1] = r[k] end
  end
  return codes
end

-- delete_acked(stream, group, done, n): delete the n entries `done` this script XACKed (the
-- Redis 7.0 path; XACKDEL deletes as it acks).
-- XDEL finds each id by walking its stream node from the start, tombstones included (~2 us an
-- id, a third of complete_batch); trimming below an id is one walk.  Every entry older than the
-- group's oldest pending entry was delivered to the group and, not being pending, acked; acked
-- entries are deleted in the same script that acks them (every script that acks does), so the
-- only such entries left are this batch's.  XTRIM MINID T, with T = min(oldest pending, newest
-- acked here), thus deletes exactly this batch's entries below T, provided the stream's oldest
-- entry is this batch's oldest (else entries the group never read could precede it: a group
-- created or moved past them); the rest are XDELed as before.  An entry below T that another
-- client acked but left in the stream goes too: acked is done, and nothing reads it again.
local function delete_acked(stream, group, done, n)
  if n == 0 then return end
  local function split(id)  -- "ms-seq" -> ms, seq ("ms" alone means seq 0, as XACK reads it)
    local p = string.find(id, '-', 1, true)
    if not p then return id, '0' end
    return string.sub(id, 1, p - 1), string.sub(id, p + 1)
  end
  local function lt(am, as, bm, bs)  -- id a < id b; both parts are decimal strings of any length
    if am ~= bm then
      if #am ~= #bm then return #am < #bm end
      return am < bm
    end
    if #as ~= #bs then return #as < #bs end
    return as < bs
  end
  local ms, ss = {}, {}
  local minm, mins = split(done[1])
  local tm, ts = minm, mins
  ms[1], ss[1] = minm, mins
  for k = 2, n do
    local a, b = split(done[k])
    ms[k], ss[k] = a, b
    if lt(a, b, minm, mins) then minm, mins = a, b elseif lt(tm, ts, a, b) then tm, ts = a, b end
  end
  local rest = done
  if lt(minm, mins, tm, ts) then
    local oldest = redis.call('XPENDING', stream, group, '-', '+', 1)[1]
    if oldest then
      local pm, ps = split(oldest[1])
      if lt(pm, ps, tm, ts) then tm, ts = pm, ps end
    end
    if lt(minm, mins, tm, ts) then
      local first = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)[1]
      if first and first[1] == minm .. '-' .. mins then
        redis.call('XTRIM', stream, 'MINID', tm .. '-' .. ts)
        rest = {}
        for k = 1, n do
          if not lt(ms[k], ss[k], tm, ts) then rest[#rest + 1] = done[k] end
        end
      end
    end
  end
  for k = 1, #rest, 500 do
    redis.call('XDEL', stream, unpack(rest, k, math.min(k + 499, #rest)))
  end
end
