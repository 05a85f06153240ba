-- rewind_group: move a consumer group's cursor back when it is past the stream's last id.
-- That happens only when an entry at the largest id (which any writer may add) was read and the
-- stream was then let out of being full the way Redis allows (the entry deleted, its last id
-- lowered with XSETID), or when XGROUP SETID set the cursor ahead: every new entry's id is then
-- below the cursor and XREADGROUP '>' delivers nothing, silently, for good.
-- The cursor goes back to the largest pending id not past the stream's last id ('0-0' when
-- there is none).  An ack deletes its entry, so every entry of the stream the group delivered is
-- pending: what lies past that id was never delivered, and is now, once; nothing pending is
-- delivered again.  A cursor not past the stream's last id is left alone (the normal case).
-- KEYS[1] = stream
-- ARGV    = [group]
-- Reply   = '' (nothing done: no stream, no group, or the cursor where it should be), or the
--           id the cursor was moved back to
local stream, group = KEYS[1], ARGV[1]
--#include key_types

-- whether canonical stream id a sorts before b (both parts are u64: compared as digit strings)
local function before(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if #am ~= #bm then return #am < #bm end
  if am ~= bm then return am < bm end
  if #as ~= #bs then return #as < #bs end
  return as < bs
end

local function field(flat, name)
  for j = 1, #flat - 1, 2 do
    if flat[j] == name then return flat[j + 1] end
  end
  return nil
end

local last = stream_last_id(stream)
if last == nil then return '' end
local cursor = nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  if field(g, 'name') == group then cursor = field(g, 'last-delivered-id') end
end
if cursor == nil or not before(last, cursor) then return '' end

local to = '0-0'
local summary = redis.call('XPENDING', stream, group)
if tonumber(summary[1]) > 0 then
  if not before(last, summary[3]) then
    to = summary[3]  -- the largest pending id
  else  -- some pending ids are past the end (entries deleted since): the largest of the others
    local start = '-'
    repeat
      local rows = redis.call('XPENDING', stream, group, start, last, 1000)
      if #rows > 0 then
        to = rows[#rows][1]
        start = '(' .. to
      end
    until #rows < 1000
  end
end
redis.call('XGROUP', 'SETID', stream, group, to)
return to
