// Narabu's signed pass, checked by nginx itself (njs, Debian's
// libnginx-mod-http-js): config/nginx-verify.conf asks `narabu.check` about
// each request to the protected site, as an auth_request.
//
// A request with a valid pass (the cookie narabu_{room}_jwt, or
// __Host-narabu_{room}_jwt with cookie_secure = true: an ES256 JWT
// signed with the key in $narabu_pass_key, for this room, not expired) goes
// through without asking Narabu. A request without a ticket at all is sent
// to the queue without asking either. Anything else asks Narabu's gate once
// (location /_narabu/gate, with ?pass=1): an admitted visitor gets a fresh
// pass (Set-Cookie) and goes through; anyone else goes to the queue.
//
// Variables it reads (set them in the location that runs it):
//   $narabu_room      the room guarding this site
//   $narabu_pass_key  the file holding Narabu's public key (SPKI PEM, from
//                     GET /.well-known/narabu-pass.pem)
// Headers it answers with, for auth_request_set:
//   X-Narabu-Queue    the queue page to redirect to (on 401)
//   Set-Cookie        the fresh pass to hand to the browser (on 204)

import fs from 'fs';

// njs 0.7 imports a P-256 public key from SPKI, not from a JWK.
async function publicKey(path) {
    const pem = fs.readFileSync(path, 'utf8');
    const body = pem.replace(/-----[^-]+-----/g, '').replace(/\s+/g, '');
    return crypto.subtle.importKey('spki', Buffer.from(body, 'base64'),
        { name: 'ECDSA', namedCurve: 'P-256' }, false, ['verify']);
}

// True for a pass signed with the key, for this room, not yet expired.
// WebCrypto checks the signature only; the claims are checked here.
async function passIsValid(r, room, token) {
    const parts = token.split('.');
    if (parts.length != 3) {
        return false;
    }
    let header, claims;
    try {
        header = JSON.parse(Buffer.from(parts[0], 'base64url').toString());
        claims = JSON.parse(Buffer.from(parts[1], 'base64url').toString());
    } catch (e) {
        return false;
    }
    if (header.alg !== 'ES256' || claims.aud !== room || typeof claims.exp !== 'number') {
        return false;
    }
    if (claims.exp <= Math.floor(Date.now() / 1000)) {
        return false;
    }
    const key = await publicKey(r.variables.narabu_pass_key);
    return crypto.subtle.verify({ name: 'ECDSA', hash: 'SHA-256' }, key,
        Buffer.from(parts[2], 'base64url'), parts[0] + '.' + parts[1]);
}

// The queue page with this page as the return path, as the gate builds it:
// only a relative path comes back as `return`.
function queueUrl(r, room) {
    const uri = r.variables.request_uri || '/';
    const safe = uri.startsWith('/') && !uri.startsWith('//') && !/[\\\x00-\x1f]/.test(uri);
    const base = '/queue/' + room;
    return safe ? base + '?return=' + encodeURIComponent(uri) : base;
}

// A cookie of Narabu's, by the name it has with cookie_secure = true
// (__Host-narabu_...) or without (narabu_...).
function cookie(r, name) {
    const wanted = ['__Host-' + name, name];
    const pairs = (r.headersIn['Cookie'] || '').split(';');
    // njs 0.7 has no for...of.
    for (let i = 0; i < wanted.length; i++) {
        for (let j = 0; j < pairs.length; j++) {
            const at = pairs[j].indexOf('=');
            if (at > 0 && pairs[j].slice(0, at).trim() === wanted[i]) {
                return pairs[j].slice(at + 1).trim();
            }
        }
    }
    return '';
}

function hasTicket(r, room) {
    const auth = r.headersIn['Authorization'] || '';
    return !!cookie(r, 'narabu_' + room) || /^bearer /i.test(auth);
}

async function check(r) {
    const room = r.variables.narabu_room;
    const token = cookie(r, 'narabu_' + room + '_jwt');
    try {
        if (token && await passIsValid(r, room, token)) {
            r.return(204);
            return;
        }
    } catch (e) {
        r.warn('narabu: the pass could not be checked: ' + e);
    }
    if (!hasTicket(r, room)) {
        r.headersOut['X-Narabu-Queue'] = queueUrl(r, room);
        r.return(401);
        return;
    }
    const gate = await r.subrequest('/_narabu/gate');
    if (gate.status == 204) {
        const cookies = gate.headersOut['Set-Cookie'];
        if (cookies && cookies.length) {
            r.headersOut['Set-Cookie'] = cookies;
        }
        r.return(204);
    } else if (gate.status == 401) {
        r.headersOut['X-Narabu-Queue'] = gate.headersOut['X-Narabu-Queue'] || queueUrl(r, room);
        r.return(401);
    } else {
        // Narabu could not be asked, or the room is unknown: fail closed.
        r.error('narabu: the gate answered ' + gate.status);
        r.return(500);
    }
}

export default { check };
