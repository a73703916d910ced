#include "server/admission/waiter_queue.h"

#include <gtest/gtest.h>

namespace gpumem {
namespace admission {
namespace {

TEST(WaiterQueueTest, PriorityThenArrival) {
  WaiterQueue<int*> q;
  int a = 1, b = 2, c = 3, d = 4;
  q.Add(0, &a);
  auto tb = q.Add(5, &b);
  q.Add(0, &c);
  q.Add(5, &d);
  std::vector<int> order;
  for (const auto& [ticket, w] : q.InOrder()) order.push_back(*w);
  EXPECT_EQ(order, (std::vector<int>{2, 4, 1, 3}));
  q.Remove(tb);
  EXPECT_EQ(*q.InOrder().front().second, 4);
  EXPECT_EQ(q.size(), 3u);
}

}  // namespace
}  // namespace admission
}  // namespace gpumem
