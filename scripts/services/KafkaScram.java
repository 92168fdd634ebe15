// Creates or changes (upserts) a SCRAM credential on the local broker, for the SASL listeners that
// scripts/services/kafka.sh configures, and waits until the broker accepts it. Used by
// `services.sh up` (user relay) and by setScramPassword in test/integration/helpers.ts.
//
//   java -cp '.cache/kafka/libs/*' scripts/services/KafkaScram.java --bootstrap 127.0.0.1:9092 \
//        --user relay --password relay-secret [--mechanism SCRAM-SHA-256|SCRAM-SHA-512|both] \
//        [--verify 127.0.0.1:9094]
//
// Why a Java file: in KRaft mode SCRAM credentials live in the cluster metadata and can only be
// changed through the AdminClient (AlterUserScramCredentials). kafka-configs.sh would do it, but
// its jar (kafka-tools) is not among the broker's libs; kafka-clients is, and Java 17 runs a
// single source file without a build step.
//
// "Takes effect": the controller acknowledges the change once it is committed, and the broker
// applies it a moment later. So this polls DescribeUserScramCredentials until the broker reports
// the mechanisms, and with --verify (a SASL_PLAINTEXT listener) logs in with the new password,
// since a changed password with the same iteration count looks identical in a describe.
//
// Prints one line on success; on failure prints "KafkaScram: <why>" on stderr and exits 1.

import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialAlteration;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.clients.admin.UserScramCredentialsDescription;

public class KafkaScram {
    static final int ITERATIONS = 4096;
    static final long TIMEOUT_MS = 20_000;

    public static void main(String[] args) {
        try {
            run(args);
        } catch (Exception e) {
            Throwable cause = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
            System.err.println("KafkaScram: " + cause.getClass().getSimpleName() + ": " + cause.getMessage());
            System.exit(1);
        }
    }

    static void run(String[] args) throws Exception {
        Map<String, String> opts = parse(args);
        String bootstrap = opts.getOrDefault("--bootstrap", "127.0.0.1:9092");
        String user = require(opts, "--user");
        String password = require(opts, "--password");
        List<ScramMechanism> mechanisms = mechanisms(opts.getOrDefault("--mechanism", "both"));
        long started = System.currentTimeMillis();
        long deadline = started + TIMEOUT_MS;

        try (Admin admin = Admin.create(clientProps(bootstrap))) {
            // One request per mechanism: the KRaft controller refuses two changes of one user in
            // one request ("A user credential cannot be altered twice in the same request").
            for (ScramMechanism m : mechanisms) {
                UserScramCredentialAlteration upsert = new UserScramCredentialUpsertion(user, new ScramCredentialInfo(m, ITERATIONS), password);
                admin.alterUserScramCredentials(List.of(upsert)).all().get(TIMEOUT_MS, TimeUnit.MILLISECONDS);
            }
            awaitDescribed(admin, user, mechanisms, deadline);
        }
        String verify = opts.get("--verify");
        if (verify != null) {
            for (ScramMechanism m : mechanisms) awaitLogin(verify, m, user, password, deadline);
        }
        System.out.printf("KafkaScram: %s has %s (%d iterations) on %s%s in %d ms%n", user,
                mechanisms.stream().map(ScramMechanism::mechanismName).collect(Collectors.joining(" + ")),
                ITERATIONS, bootstrap, verify == null ? "" : ", login checked on " + verify,
                System.currentTimeMillis() - started);
    }

    /** Until the broker's metadata lists every mechanism for the user with our iteration count. */
    static void awaitDescribed(Admin admin, String user, List<ScramMechanism> mechanisms, long deadline) throws Exception {
        while (true) {
            Set<ScramMechanism> have = Set.of();
            try {
                UserScramCredentialsDescription d = admin.describeUserScramCredentials(List.of(user)).description(user).get();
                have = d.credentialInfos().stream().filter(i -> i.iterations() == ITERATIONS)
                        .map(ScramCredentialInfo::mechanism).collect(Collectors.toSet());
            } catch (ExecutionException e) {
                // ResourceNotFoundException: the broker has not applied the new user yet
            }
            if (have.containsAll(mechanisms)) return;
            if (System.currentTimeMillis() > deadline) {
                throw new IllegalStateException("the broker still does not list " + mechanisms + " for " + user + " after " + TIMEOUT_MS + " ms (has " + have + ")");
            }
            Thread.sleep(100);
        }
    }

    /** Until a SCRAM login with the new password succeeds on the given SASL_PLAINTEXT listener. */
    static void awaitLogin(String bootstrap, ScramMechanism m, String user, String password, long deadline) throws Exception {
        Properties props = clientProps(bootstrap);
        props.put("security.protocol", "SASL_PLAINTEXT");
        props.put("sasl.mechanism", m.mechanismName());
        props.put("sasl.jaas.config", "org.apache.kafka.common.security.scram.ScramLoginModule required username=\""
                + jaasQuote(user) + "\" password=\"" + jaasQuote(password) + "\";");
        while (true) {
            try (Admin admin = Admin.create(props)) {
                admin.describeCluster().nodes().get(5, TimeUnit.SECONDS);
                return;
            } catch (ExecutionException e) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException(m.mechanismName() + " login as " + user + " on " + bootstrap + " still fails after " + TIMEOUT_MS + " ms: " + e.getCause().getMessage());
                }
            }
            Thread.sleep(200);
        }
    }

    static Properties clientProps(String bootstrap) {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.CLIENT_ID_CONFIG, "kafka-scram");
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "5000");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "10000");
        return props;
    }

    static List<ScramMechanism> mechanisms(String arg) {
        switch (arg.toUpperCase()) {
            case "BOTH": return List.of(ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512);
            case "SCRAM-SHA-256": return List.of(ScramMechanism.SCRAM_SHA_256);
            case "SCRAM-SHA-512": return List.of(ScramMechanism.SCRAM_SHA_512);
            default: throw new IllegalArgumentException("--mechanism must be SCRAM-SHA-256, SCRAM-SHA-512 or both, not " + arg);
        }
    }

    static Map<String, String> parse(String[] args) {
        Set<String> known = Set.of("--bootstrap", "--user", "--password", "--mechanism", "--verify");
        Map<String, String> opts = new java.util.HashMap<>();
        for (int i = 0; i < args.length; i += 2) {
            if (!known.contains(args[i]) || i + 1 >= args.length) {
                throw new IllegalArgumentException("usage: KafkaScram --bootstrap HOST:PORT --user NAME --password SECRET [--mechanism SCRAM-SHA-256|SCRAM-SHA-512|both] [--verify SASL_HOST:PORT] (bad argument: " + args[i] + ")");
            }
            opts.put(args[i], args[i + 1]);
        }
        return opts;
    }

    static String require(Map<String, String> opts, String name) {
        String v = opts.get(name);
        if (v == null || v.isEmpty()) throw new IllegalArgumentException(name + " is required");
        return v;
    }

    static String jaasQuote(String s) {
        return s.replace("\\", "\\\\").replace("\"", "\\\"");
    }
}
