-- scan_entries: a bounded look through a stream for viewers (the dashboard's job search and DLQ
-- pages), filtered and cut inside Redis so a request never pulls whole windows of payloads.
-- Entries are read in steps of `step`, at most `count` entries or `max_bytes` bytes of field
-- values in all; an entry is returned only if its `d` holds `needle` ('' = every entry), with
-- each field value cut to `clip` bytes (0 = whole; `d` stays whole when `whole_d` is '1') and
-- the full length of its `d` (-1 when it has none); with a `name`, only entries whose `n` is
-- exactly that name.
-- KEYS[1] = stream
-- ARGV    = [start, end, count, needle, clip, whole_d, step, max_bytes, max_matches, name?]
--           (start/end as XRANGE takes them, '(' for exclusive)
-- Reply   = [last scanned id or '', entries scanned, done (1: the range ended), matches...]
--           each match = [entry id, [field, value, ...], d length]
local stream, start, stop = KEYS[1], ARGV[1], ARGV[2]
local count, needle, clip = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local whole_d, step, budget, max_matches = ARGV[6] == '1', tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local name = ARGV[10] or ''
local out, last, scanned, done, seen = {}, '', 0, 0, 0
while scanned < count and seen < budget and #out < max_matches do
  local n = math.min(step, count - scanned)
  local rows = redis.call('XRANGE', stream, start, stop, 'COUNT', n)
  for _, row in ipairs(rows) do
    local id, f = row[1], row[2]
    last = id
    scanned = scanned + 1
    local d, n = nil, ''
    for i = 1, #f, 2 do
      seen = seen + #f[i + 1]
      if f[i] == 'd' then d = f[i + 1] elseif f[i] == 'n' then n = f[i + 1] end
    end
    if (name == '' or n == name) and (needle == '' or (d and string.find(d, needle, 1, true))) then
      local fields = {}
      for i = 1, #f, 2 do
        local v = f[i + 1]
        if clip > 0 and #v > clip and not (whole_d and f[i] == 'd') then v = string.sub(v, 1, clip) end
        fields[#fields + 1] = f[i]
        fields[#fields + 1] = v
      end
      out[#out + 1] = {id, fields, d and #d or -1}
      if #out >= max_matches then break end
    end
    if seen >= budget then break end
  end
  if #rows < n then
    if #out < max_matches and seen < budget then done = 1 end
    break
  end
  if last == '18446744073709551615-18446744073709551615' then  -- nothing can follow the largest id
    done = 1
    break
  end
  start = '(' .. last
end
local reply = {last, scanned, done}
for _, m in ipairs(out) do reply[#reply + 1] = m end
return reply
