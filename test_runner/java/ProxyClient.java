// A JDBC client of the proxy (test_runner/test_proxy.py): connects with the
// URL, user and password it is given, and prints what a few statements
// answer, one line each, for the test to compare.
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.Statement;
import java.util.Properties;

public class ProxyClient {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.setProperty("user", args[1]);
        props.setProperty("password", args[2]);
        try (Connection conn = DriverManager.getConnection(args[0], props)) {
            try (Statement st = conn.createStatement();
                 ResultSet rs = st.executeQuery("SELECT count(*), current_user FROM kept")) {
                rs.next();
                System.out.println("count=" + rs.getLong(1) + " user=" + rs.getString(2));
            }
            // A prepared statement, run often enough to become a server-side one.
            try (PreparedStatement ps = conn.prepareStatement("SELECT v FROM kept WHERE id = ?")) {
                String last = null;
                for (int i = 1; i <= 10; i++) {
                    ps.setInt(1, i);
                    try (ResultSet rs = ps.executeQuery()) {
                        rs.next();
                        last = rs.getString(1);
                    }
                }
                System.out.println("v10=" + last);
            }
            conn.setAutoCommit(false);
            try (Statement st = conn.createStatement()) {
                st.executeUpdate("INSERT INTO kept VALUES (-1, 'from jdbc')");
            }
            conn.commit();
            try (Statement st = conn.createStatement();
                 ResultSet rs = st.executeQuery("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")) {
                rs.next();
                System.out.println("compute_ssl=" + rs.getBoolean(1));
            }
        }
    }
}
