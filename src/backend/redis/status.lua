-- status: one or more tickets of one room in one call (batch.rs gathers the
-- reads of many streams). ARGV[3] = '1' to count as activity (on an
-- admitted ticket, its arrival), then ARGV[4], ARGV[5], … = ticket epoch,
-- ticket id pairs. Returns one reply per ticket, in order, each
-- {'ok', status...} | {'noticket'}; or {'noroom'}.
if not room(STATUS_FIELDS) then return {'noroom'} end
local touch = ARGV[3] == '1'
local out = {}
for i = 4, #ARGV - 1, 2 do
  local t = ticket_of(ARGV[i], ARGV[i + 1])
  if not t then
    out[#out + 1] = {'noticket'}
  else
    if touch and (t.state == 0 or t.state == 1) then
      if NOW > t.seen then t.seen = NOW end
      if t.state == 1 then
        t.arrived = 1
        redis.call('ZADD', K('adm'), deadline(t), S(t.id))
      elseif t.qi >= 0 then
        redis.call('ZADD', K('seen'), 'XX', t.seen, S(t.id))
      end
      t.dirty = true
    end
    local reply = {'ok'}
    for _, v in ipairs(status_reply(t, true)) do reply[#reply + 1] = v end
    if t.dirty then save_ticket(t) end
    out[#out + 1] = reply
  end
end
return out
