-- status: one or more tickets of one room in one call (batch.rs gathers the
-- reads of many streams). ARGV[3] = '1' to count as a sign of life (on an
-- admitted ticket, its arrival), then ARGV[4], ARGV[5], ... = ticket epoch,
-- ticket id pairs.
-- Returns {r = 'ok', w = waiting, t = [facts | {x = 'noticket'}, ...]} | {r = 'noroom'}
if not room({'waiting', 'issued'}) then return reply({r = 'noroom'}) end
local touching = ARGV[3] == '1'
local out = {}
for i = 4, #ARGV - 1, 2 do
  local t = nil
  if ARGV[i] == EPOCH and tonumber(ARGV[i + 1]) < n('issued') then
    t = load_ticket(ARGV[i + 1])
  end
  if not t then
    out[#out + 1] = {x = 'noticket'}
  else
    if touching then touch(t) end
    local ahead = ahead_of(t)
    if t.dirty then save_ticket(t) end
    out[#out + 1] = facts(t, ahead)
  end
end
return reply({r = 'ok', w = n('waiting'), t = out})
