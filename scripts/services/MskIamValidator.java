// A broker-side check of Amazon MSK IAM tokens, for a local listener that behaves as MSK's IAM
// listener does: SASL/OAUTHBEARER whose bearer token is what aws-msk-iam-sasl-signer-js makes,
// the base64url of a SigV4-presigned URL
//
//   https://kafka.<region>.amazonaws.com/?Action=kafka-cluster%3AConnect&User-Agent=...
//     &X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=<key>%2F<yyyymmdd>%2F<region>%2Fkafka-cluster%2Faws4_request
//     &X-Amz-Date=<yyyymmddThhmmssZ>&X-Amz-Expires=<seconds>&X-Amz-SignedHeaders=host&X-Amz-Signature=<hex>
//
// It recomputes the signature (canonical request, string to sign, the HMAC chain of the secret
// key) with the secret key of the token's access key, and refuses a token that is malformed,
// signed with another key or for another action, dated in the future, or expired. MSK checks the
// same, then the IAM policy; there is no policy here: a valid token logs in as its access key.
//
// Used by test/integration/private-broker.ts (startPrivateBroker({ mskIam })): compiled against
// the broker's jars into .cache/msk-iam-validator/<hash of this file>/ and put on the broker's
// class path, plugged in as an OAUTHBEARER listener's server callback handler:
//
//   listener.name.iam.oauthbearer.sasl.server.callback.handler.class=MskIamValidator
//   listener.name.iam.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required \
//     unsecuredLoginStringClaim_sub="broker" accessKeyId="test" secretAccessKey="test" maxLifetimeSeconds="900";
//
// JAAS options (all optional): accessKeyId and secretAccessKey, the one key it knows (default
// test/test, the local AWS emulator's); maxLifetimeSeconds, a cap on a token's lifetime from its
// X-Amz-Date whatever its X-Amz-Expires says (default 900), so a test can make tokens expire in
// seconds; clockSkewSeconds, how far in the future X-Amz-Date may be (default 5).
// (unsecuredLoginStringClaim_sub is for the broker's own login on the listener, which Kafka's
// login module needs even when the broker never uses it.)
//
// A self-check from the command line: java -cp '.cache/kafka/libs/*:<dir>' MskIamValidator <token>
// prints the principal, or the reason for the refusal and exits 1.

import java.net.URI;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.time.Instant;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import javax.security.auth.callback.Callback;
import javax.security.auth.callback.UnsupportedCallbackException;
import javax.security.auth.login.AppConfigurationEntry;
import org.apache.kafka.common.security.auth.AuthenticateCallbackHandler;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerExtensionsValidatorCallback;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerToken;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallback;

public class MskIamValidator implements AuthenticateCallbackHandler {
    static final String ACTION = "kafka-cluster:Connect";
    static final String SERVICE = "kafka-cluster";
    static final String ALGORITHM = "AWS4-HMAC-SHA256";
    /** the signer's (and MSK's) longest token */
    static final long MAX_EXPIRES_SECONDS = 900;
    static final DateTimeFormatter AMZ_DATE = DateTimeFormatter.ofPattern("yyyyMMdd'T'HHmmss'Z'");
    static final String EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    String accessKeyId = "test";
    String secretAccessKey = "test";
    long maxLifetimeSeconds = MAX_EXPIRES_SECONDS;
    long clockSkewSeconds = 5;

    /** A token refused, and why (the broker logs it; the client is told only invalid_token). */
    static final class Refused extends Exception {
        Refused(String why) {
            super(why);
        }
    }

    @Override
    public void configure(Map<String, ?> configs, String saslMechanism, List<AppConfigurationEntry> jaasConfigEntries) {
        for (AppConfigurationEntry entry : jaasConfigEntries) {
            Map<String, ?> o = entry.getOptions();
            if (o.get("accessKeyId") != null) accessKeyId = (String) o.get("accessKeyId");
            if (o.get("secretAccessKey") != null) secretAccessKey = (String) o.get("secretAccessKey");
            if (o.get("maxLifetimeSeconds") != null) maxLifetimeSeconds = Long.parseLong((String) o.get("maxLifetimeSeconds"));
            if (o.get("clockSkewSeconds") != null) clockSkewSeconds = Long.parseLong((String) o.get("clockSkewSeconds"));
        }
    }

    @Override
    public void handle(Callback[] callbacks) throws UnsupportedCallbackException {
        for (Callback callback : callbacks) {
            if (callback instanceof OAuthBearerValidatorCallback v) {
                try {
                    v.token(validate(v.tokenValue(), System.currentTimeMillis()));
                } catch (Refused e) {
                    System.err.println("MskIamValidator: refused a token: " + e.getMessage());
                    v.error("invalid_token", null, null);
                }
            } else if (callback instanceof OAuthBearerExtensionsValidatorCallback) {
                // MSK's signer sends no SASL extensions; any a client sends are ignored (not validated, not returned)
            } else {
                throw new UnsupportedCallbackException(callback);
            }
        }
    }

    @Override
    public void close() {}

    /** The token's principal and lifetime, or Refused saying what is wrong with it. */
    OAuthBearerToken validate(String token, long nowMs) throws Refused {
        if (token == null || token.isEmpty()) throw new Refused("empty token");
        String url;
        try {
            url = new String(Base64.getUrlDecoder().decode(token.replace("=", "")), StandardCharsets.UTF_8);
        } catch (IllegalArgumentException e) {
            throw new Refused("not base64url: " + e.getMessage());
        }
        URI uri;
        try {
            uri = new URI(url);
        } catch (Exception e) {
            throw new Refused("not a URL: " + e.getMessage());
        }
        if (!"https".equals(uri.getScheme()) || uri.getHost() == null || uri.getRawQuery() == null) throw new Refused("not an https URL with a query");
        if (!"/".equals(uri.getRawPath())) throw new Refused("path is not /");
        Map<String, String> q = query(uri.getRawQuery());

        if (!ACTION.equals(q.get("Action"))) throw new Refused("Action is " + q.get("Action") + ", not " + ACTION);
        if (!ALGORITHM.equals(q.get("X-Amz-Algorithm"))) throw new Refused("X-Amz-Algorithm is not " + ALGORITHM);
        if (!"host".equals(q.get("X-Amz-SignedHeaders"))) throw new Refused("X-Amz-SignedHeaders is not host");
        String signature = required(q, "X-Amz-Signature");
        String[] credential = required(q, "X-Amz-Credential").split("/", -1);
        if (credential.length != 5 || !SERVICE.equals(credential[3]) || !"aws4_request".equals(credential[4])) {
            throw new Refused("X-Amz-Credential is not <key>/<date>/<region>/" + SERVICE + "/aws4_request");
        }
        String key = credential[0], day = credential[1], region = credential[2];
        if (!uri.getHost().equals("kafka." + region + ".amazonaws.com")) throw new Refused("host " + uri.getHost() + " is not kafka." + region + ".amazonaws.com");
        String amzDate = required(q, "X-Amz-Date");
        long signedAtMs;
        try {
            signedAtMs = LocalDateTime.parse(amzDate, AMZ_DATE).toInstant(ZoneOffset.UTC).toEpochMilli();
        } catch (Exception e) {
            throw new Refused("X-Amz-Date " + amzDate + " is not yyyyMMddTHHmmssZ");
        }
        if (!amzDate.startsWith(day)) throw new Refused("X-Amz-Credential's date " + day + " is not X-Amz-Date's");
        double expires;
        try {
            expires = Double.parseDouble(required(q, "X-Amz-Expires"));
        } catch (NumberFormatException e) {
            throw new Refused("X-Amz-Expires is not a number");
        }
        if (!(expires > 0 && expires <= MAX_EXPIRES_SECONDS)) throw new Refused("X-Amz-Expires " + expires + " is not within 1-" + MAX_EXPIRES_SECONDS + " seconds");

        if (!key.equals(accessKeyId)) throw new Refused("unknown access key " + key);
        String expected = sign(secretAccessKey, canonicalRequest(uri.getHost(), q), amzDate, day, region);
        if (!MessageDigest.isEqual(expected.getBytes(StandardCharsets.US_ASCII), signature.getBytes(StandardCharsets.US_ASCII))) {
            throw new Refused("signature does not match (signed with another secret key, or altered)");
        }

        if (signedAtMs > nowMs + clockSkewSeconds * 1000) throw new Refused("X-Amz-Date " + amzDate + " is in the future");
        long expiresAtMs = signedAtMs + (long) (Math.min(expires, maxLifetimeSeconds) * 1000);
        if (nowMs >= expiresAtMs) throw new Refused("expired at " + Instant.ofEpochMilli(expiresAtMs) + " (X-Amz-Date " + amzDate + ", lifetime " + Math.min(expires, maxLifetimeSeconds) + " s)");
        return new Token(token, key, signedAtMs, expiresAtMs);
    }

    /** The query's parameters, decoded. */
    static Map<String, String> query(String raw) throws Refused {
        Map<String, String> q = new HashMap<>();
        for (String pair : raw.split("&")) {
            int eq = pair.indexOf('=');
            if (eq <= 0) throw new Refused("malformed query parameter " + pair);
            String name = URLDecoder.decode(pair.substring(0, eq), StandardCharsets.UTF_8);
            if (q.put(name, URLDecoder.decode(pair.substring(eq + 1), StandardCharsets.UTF_8)) != null) throw new Refused("query parameter " + name + " given twice");
        }
        return q;
    }

    static String required(Map<String, String> q, String name) throws Refused {
        String v = q.get(name);
        if (v == null || v.isEmpty()) throw new Refused("no " + name);
        return v;
    }

    /**
     * SigV4's canonical request of a presigned GET: every query parameter but the signature, sorted,
     * RFC 3986-encoded; the host header; the empty body's hash. The signer adds User-Agent after
     * signing, so it is not part of what was signed.
     */
    static String canonicalRequest(String host, Map<String, String> q) {
        TreeMap<String, String> signed = new TreeMap<>();
        for (Map.Entry<String, String> e : q.entrySet()) {
            if (Set.of("X-Amz-Signature", "User-Agent").contains(e.getKey())) continue;
            signed.put(uriEncode(e.getKey()), uriEncode(e.getValue()));
        }
        StringBuilder query = new StringBuilder();
        for (Map.Entry<String, String> e : signed.entrySet()) {
            if (query.length() > 0) query.append('&');
            query.append(e.getKey()).append('=').append(e.getValue());
        }
        return String.join("\n", "GET", "/", query.toString(), "host:" + host, "", "host", EMPTY_SHA256);
    }

    static String sign(String secretKey, String canonicalRequest, String amzDate, String day, String region) {
        String scope = day + "/" + region + "/" + SERVICE + "/aws4_request";
        String toSign = String.join("\n", ALGORITHM, amzDate, scope, hex(sha256(canonicalRequest.getBytes(StandardCharsets.UTF_8))));
        byte[] k = hmac(("AWS4" + secretKey).getBytes(StandardCharsets.UTF_8), day);
        k = hmac(k, region);
        k = hmac(k, SERVICE);
        k = hmac(k, "aws4_request");
        return hex(hmac(k, toSign));
    }

    /** RFC 3986 percent-encoding: everything but A-Z a-z 0-9 - _ . ~ */
    static String uriEncode(String s) {
        StringBuilder out = new StringBuilder();
        for (byte b : s.getBytes(StandardCharsets.UTF_8)) {
            char c = (char) (b & 0xff);
            if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '~') out.append(c);
            else out.append('%').append(String.format("%02X", b & 0xff));
        }
        return out.toString();
    }

    static byte[] sha256(byte[] data) {
        try {
            return MessageDigest.getInstance("SHA-256").digest(data);
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }

    static byte[] hmac(byte[] key, String data) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(key, "HmacSHA256"));
            return mac.doFinal(data.getBytes(StandardCharsets.UTF_8));
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }

    static String hex(byte[] bytes) {
        StringBuilder sb = new StringBuilder();
        for (byte b : bytes) sb.append(String.format("%02x", b & 0xff));
        return sb.toString();
    }

    /** A valid token: its access key is the principal, and it lives until the token expires (connections.max.reauth.ms ends a session then). */
    record Token(String value, String principalName, long signedAtMs, long lifetimeMs) implements OAuthBearerToken {
        @Override
        public Set<String> scope() {
            return Set.of();
        }

        @Override
        public Long startTimeMs() {
            return signedAtMs;
        }
    }

    public static void main(String[] args) {
        if (args.length != 1) {
            System.err.println("usage: MskIamValidator <token>");
            System.exit(2);
        }
        try {
            OAuthBearerToken t = new MskIamValidator().validate(args[0], System.currentTimeMillis());
            System.out.println("valid: principal " + t.principalName() + ", expires " + Instant.ofEpochMilli(t.lifetimeMs()));
        } catch (Refused e) {
            System.out.println("refused: " + e.getMessage());
            System.exit(1);
        }
    }
}
